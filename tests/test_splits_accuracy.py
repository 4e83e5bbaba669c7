"""Node splits (OGB files, seeded random), per-epoch accuracy and LayerNorm in the trainer."""

import numpy as np
import pytest

from plexus_tune.errors import UserError
from plexus_tune.graph import synthetic
from plexus_tune.graph.splits import (
    TEST,
    TRAIN,
    UNUSED,
    VALID,
    node_split,
    random_split,
    read_ogb_split,
    split_sizes,
    write_ogb_dataset,
    write_ogb_split,
)

SPEC = "rmat:nodes=96,edges=768,features=8,classes=3,seed=4"


def test_random_split_sizes_seeded_and_disjoint():
    a = random_split(103, seed=7)
    assert split_sizes(a) == {"train": 61, "valid": 20, "test": 22}  # floor(0.6 * 103), floor(0.2 * 103), rest
    assert np.array_equal(a, random_split(103, seed=7)) and not np.array_equal(a, random_split(103, seed=8))
    assert set(np.unique(a)) == {TRAIN, VALID, TEST}


def test_ogb_split_round_trip_and_bad_files(tmp_path):
    codes = np.array([TRAIN, TEST, VALID, UNUSED, TRAIN], dtype=np.int8)
    write_ogb_split(tmp_path / "ds", codes, kind="time")
    assert np.array_equal(read_ogb_split(tmp_path / "ds", 5), codes)
    assert np.array_equal(read_ogb_split(tmp_path / "ds" / "raw", 5), codes)  # the raw directory names it too
    got, text = node_split(str(tmp_path / "ds"), 5, seed=0)
    assert np.array_equal(got, codes) and text == "ogb:time"
    assert node_split(str(tmp_path / "elsewhere"), 5, seed=3)[1].startswith("random:")
    with pytest.raises(UserError, match="out of range"):
        read_ogb_split(tmp_path / "ds", 3)
    write_ogb_split(tmp_path / "dup", np.zeros(4), kind="a")
    np.savetxt(tmp_path / "dup" / "split" / "a" / "test.csv.gz", [0], fmt="%d")
    with pytest.raises(UserError, match="another part"):
        read_ogb_split(tmp_path / "dup", 4)


def _accuracy(logits, labels, codes):
    pred = np.argmax(logits, axis=1)  # first maximum, as the trainer picks it
    return {part: float(np.mean(pred[codes == k] == labels[codes == k])) for k, part in enumerate(("train", "valid", "test"))}


@pytest.mark.parametrize("grid, layer_norm", [((2, 1, 2), True), ((1, 2, 1), False)])
def test_trainer_accuracy_and_layer_norm_match_pyg(tmp_path, grid, layer_norm):
    from plexus_tune.trainer import TrainConfig
    from plexus_tune.measure.training import run_training

    graph = synthetic(SPEC)
    codes = random_split(graph.num_nodes, seed=11)
    codes[:5] = UNUSED  # nodes in no part: neither trained on nor counted
    root = write_ogb_dataset(graph, tmp_path / "ogbn_tiny", codes, kind="handmade")
    config = TrainConfig(grid=grid, graph=str(root), layers=3, hidden=8, epochs=4, warmup=1, seed=2, check=True,
                         collect_outputs=True, layer_norm=layer_norm, threads_per_rank=1)
    rec = run_training(config)
    assert rec["split"] == "ogb:handmade"
    assert rec["split_sizes"] == split_sizes(codes)
    assert rec["check_loss_rel_diff"] < 1e-5 and rec["check_output_rel_diff"] < 1e-5
    assert rec["options"]["layer_norm"] is layer_norm
    # the last epoch's accuracy recomputed from the assembled logits (their forward pass)
    want = _accuracy(rec["outputs"], graph.labels, codes)
    assert rec["final_accuracy"] == pytest.approx(want, abs=1e-12)
    assert {k: v[-1] for k, v in rec["accuracy"].items()} == rec["final_accuracy"]
    assert rec["reference_accuracy"] == pytest.approx(want, abs=1e-12)
    assert all(len(v) == 4 for v in rec["accuracy"].values())


def test_low_precision_check_reports_difference_and_fp32_accuracy():
    from plexus_tune.cli.train import summary_lines
    from plexus_tune.trainer import TrainConfig
    from plexus_tune.measure.training import run_training

    config = TrainConfig(grid=(2, 1, 1), synthetic=SPEC, layers=2, hidden=8, epochs=3, warmup=1, check=True,
                         comm_precision="int2", threads_per_rank=1)
    rec = run_training(config)
    assert rec["comm_precision"] == "int2" and rec["check_loss_rel_diff"] > 1e-6  # quantized: not FP32's rounding
    text = "\n".join(summary_lines(rec))
    assert "int2 against serial PyG at FP32" in text and "accuracy against serial PyG" in text
    assert set(rec["reference_accuracy"]) == {"train", "valid", "test"}
