"""The family trainers across two emulated nodes (network namespaces, shaped links, torchrun agents)."""

import numpy as np
import pytest

from plexus_tune.graph import gcn_normalize, synthetic
from plexus_tune.graph.partition import partition_exchange
from plexus_tune.launch.launchers import make_launcher
from plexus_tune.model.volumes import cagnet_15d_schedule, rank_volumes, supergcn_schedule
from plexus_tune.model.workload import model_widths
from plexus_tune.measure.training import run_training
from plexus_tune.trainer import TrainConfig
from test_cluster_emulated import needs_netns

SPEC = "rmat:nodes=200,edges=1200,features=8,classes=3,seed=4"
CLUSTER = "emulated:nodes=2,ranks_per_node=2,inter_gbps=0.2,inter_latency_us=0"


@pytest.mark.slow
@needs_netns
@pytest.mark.timeout(600)
def test_families_train_across_emulated_nodes():
    graph = synthetic(SPEC)
    widths = model_widths(8, 3, 2, 6)
    common = dict(synthetic=SPEC, layers=2, hidden=6, epochs=3, warmup=1, check=True, timeout_s=300)
    configs = [TrainConfig(algorithm="cagnet-1.5d", gpus=4, replication=2, **common),
               TrainConfig(algorithm="supergcn", gpus=4, aggregation="hybrid", **common)]
    launcher = make_launcher(cluster=CLUSTER)
    with launcher:
        records = [run_training(config, launcher=launcher) for config in configs]
    plan = partition_exchange(gcn_normalize(graph.adjacency), 4, seed=0)
    models = [rank_volumes(cagnet_15d_schedule(200, widths, 4, 2), 4),
              rank_volumes(supergcn_schedule(widths, plan.forward_rows("hybrid")), 4)]
    for record, model in zip(records, models):
        assert record["status"] == "ok" and record["launcher"] == "emulated"
        assert record["rank_nodes"] == [0, 0, 1, 1] and record["placement_ok"] is True
        assert record["check_loss_rel_diff"] < 1e-5 and record["check_output_rel_diff"] < 1e-4
        for name, sent in record["comm_bytes_per_rank"].items():
            np.testing.assert_array_equal(sent, model[name], err_msg=f"{record['algorithm']} {name}")
