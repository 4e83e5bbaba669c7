"""ScaleGNN's 4D trainer across two emulated nodes: the data-parallel groups sit one per node,
so the gradient all-reduce at stride Gx Gy Gz crosses the shaped link."""

import pytest

from plexus_tune.launch.launchers import make_launcher
from plexus_tune.measure.training import run_training
from plexus_tune.trainer import TrainConfig
from test_cluster_emulated import needs_netns

SPEC = "rmat:nodes=200,edges=1200,features=8,classes=3,seed=4"
CLUSTER = "emulated:nodes=2,ranks_per_node=2,inter_gbps=0.2,inter_latency_us=0"


@pytest.mark.slow
@needs_netns
@pytest.mark.timeout(600)
def test_data_parallel_groups_train_one_per_emulated_node():
    config = TrainConfig(algorithm="scalegnn-4d", grid=(2, 1, 1), dp=2, batch_size=64, synthetic=SPEC, layers=2,
                         hidden=6, epochs=3, warmup=1, check=True, timeout_s=300)
    launcher = make_launcher(cluster=CLUSTER)
    with launcher:
        record = run_training(config, launcher=launcher)
    assert record["status"] == "ok" and record["launcher"] == "emulated"
    assert record["gpus"] == 4 and record["rank_nodes"] == [0, 0, 1, 1] and record["placement_ok"] is True
    assert record["check_loss_rel_diff"] < 1e-5 and record["check_output_rel_diff"] < 1e-4
    assert record["check_grad_rel_diff"] < 1e-4
    assert record["comm_dp_ms"] > 0  # the groups' all-reduce ran, across the nodes
    assert record["sample_work_ms"] > 0  # sampled on the prefetch thread; its wait is what the epoch holds
    assert record["options"]["fixed_features"] is False  # the input features trained: their rows gathered too
