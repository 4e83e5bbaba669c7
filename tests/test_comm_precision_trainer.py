"""The trainer's --comm-precision: bytes its collectives send, GridComm reductions, bad input."""

import numpy as np
import pytest
import torch

from plexus_tune.errors import UserError
from plexus_tune.launch import launch_local

SPEC = "rmat:nodes=64,edges=512,features=16,classes=4,seed=1"


def _train_precisions(rank, world_size, grid, precisions):
    from plexus_tune.trainer import TrainConfig
    from plexus_tune.trainer.rank import rank_main

    # "fixed": FP32 with fixed input features
    configs = [TrainConfig(grid=grid, synthetic=SPEC, layers=1, hidden=8, epochs=2, warmup=0, seed=2,
                           comm_precision="fp32" if p == "fixed" else p, fixed_features=p == "fixed")
               for p in precisions]
    results = rank_main(rank, world_size, ("synthetic", SPEC), configs)
    if rank != 0:
        return None
    return [{"bytes": r["comm_bytes"], "losses": r["losses"]} for r in results]


@pytest.fixture(scope="module")
def sent():
    """Per grid and precision: (ranks, epochs) of {class: bytes} of a one-layer GCN, N = 64, D = [16, 4]."""
    out = {}
    for grid in ((2, 1, 1), (1, 1, 2)):
        precisions = ("fp32", "bf16", "int2", "fixed")
        results = launch_local(_train_precisions, 2, (grid, precisions), timeout_s=240, threads_per_rank=1)[0]
        for precision, result in zip(precisions, results):
            out[grid, precision] = result["bytes"]
    return out


def _per_rank(sent, grid, precision):
    per = sent[grid, precision]
    assert all(epochs[0] == epochs[-1] for epochs in per)  # every epoch sends the same
    return [epochs[-1] for epochs in per]


def test_outer_axis_bytes_hand_derived(sent):
    # Grid 2x1x1, layer 0 roles (outer X, inner Y, depth Z): only the aggregation all-reduces
    # of H = A F (forward) and dH (backward) communicate, each over 64 x 16 FP32 values on 2 ranks.
    # fp32 ring: 2 (g-1) ceil(n/g) 4 = 2 * 512 * 4 = 4096 bytes a call, two calls.
    # bf16: half.  int2: rows in 2 chunks of 32; a chunk is 32 rows x ceil(16 * 2 / 8) = 4
    # bytes of codes + 8 bytes of zero and scale per row = 384; sent twice a call (all-to-all,
    # all-gather): 768 a call, 1536 for two = 8192 / 16 + 2 calls * 2 phases * 32 rows * 8.
    want = {"fp32": 8192, "bf16": 4096, "int2": 1536}
    for precision, total in want.items():
        for rank_bytes in _per_rank(sent, (2, 1, 1), precision):
            assert rank_bytes == {"aggregation": total, "combination": 0, "gather": 0}, precision


def test_depth_axis_bytes_hand_derived(sent):
    # Grid 1x1x2: the depth axis carries every collective of the gather class.
    # fp32 per rank: all-gather F (block 32 x 16): 1 * 32*16*4 = 2048; all-gather W (block 8 x 4)
    # forward and backward: 2 * 128; all-reduce db (4 values): 2 * 2 * 4 = 16; reduce-scatter dW
    # (blocks 8 x 4): 128; reduce-scatter dF (blocks 32 x 16): 2048. Total 4496.
    # int2: F 32*4 + 8*32 = 384; W 8*1 + 8*8 = 72 (three times: two gathers, one scatter);
    # db one row of 4 padded to 2 row chunks: 2 * (1 + 8) = 18; dF 384. Total 1002.
    fp32, bf16, int2 = (_per_rank(sent, (1, 1, 2), p) for p in ("fp32", "bf16", "int2"))
    for r in range(2):
        assert fp32[r] == {"aggregation": 0, "combination": 0, "gather": 4496}
        assert bf16[r] == {"aggregation": 0, "combination": 0, "gather": 2248}
        assert int2[r] == {"aggregation": 0, "combination": 0, "gather": 1002}
        # int2 = fp32 / 16 + parameters (8 bytes per row sent) + the padding of the 4-value row
        params = 8 * (32 + 8 + 8 + 8 + 32) + 2 * 8
        assert int2[r]["gather"] == fp32[r]["gather"] // 16 + params + 1


def test_bf16_halves_every_class_on_a_full_grid():
    """Grid 2x2x1, two layers: every class communicates; bf16 sends exactly half of FP32 in each."""
    results = launch_local(_train_precisions, 4, ((2, 2, 1), ("fp32", "bf16")), timeout_s=240,
                           threads_per_rank=1)[0]
    fp32 = [epochs[-1] for epochs in results[0]["bytes"]]
    bf16 = [epochs[-1] for epochs in results[1]["bytes"]]
    assert any(rank["aggregation"] and rank["combination"] for rank in fp32)
    for a, b in zip(fp32, bf16):
        assert {k: 2 * v for k, v in b.items()} == a


# ---------------------------------------------------------------------------------------
# GridComm: a quantized all-reduce over each axis of a 2 x 2 grid equals the FP32 sum
# ---------------------------------------------------------------------------------------
def _grid_reduce(rank, world_size):
    from plexus_tune.trainer.comm import GridComm, PhaseTimer

    timer = PhaseTimer()
    comm = GridComm((2, 2, 1), rank, timer, precision="aggregation=int8,combination=int4", seed=5)
    out = {}
    for axis, cls in ((0, "aggregation"), (1, "combination")):
        x = torch.from_numpy(_input(rank, axis))
        comm.all_reduce(x, axis, comm_class=cls)
        out[axis] = x.numpy().copy()
    loss_stat = torch.from_numpy(_input(rank, 0))
    comm.all_reduce(loss_stat, 0)  # no class: FP32 whatever the classes' precisions
    out["fp32"] = loss_stat.numpy().copy()
    out["quant_ms"] = timer.current["quant_ms"]
    out["bytes"] = dict(comm.counter.bytes)
    comm.close()
    return out


def _input(rank, axis):
    rng = np.random.default_rng(100 * rank + axis)
    return (rng.standard_normal((6, 8)) * (1 + np.arange(6))[:, None]).astype(np.float32)


def test_grid_comm_quantized_reductions_within_bound():
    from plexus_tune.model.grid import coords_of, rank_of

    per_rank = launch_local(_grid_reduce, 4, timeout_s=120, threads_per_rank=1)
    grid = (2, 2, 1)
    for axis, levels in ((0, 255), (1, 15)):
        for rank in range(4):
            c = list(coords_of(rank, grid))
            members = []
            for k in range(2):
                c[axis] = k
                members.append(int(rank_of(c[0], c[1], c[2], grid)))
            inputs = [_input(m, axis).astype(np.float64) for m in members]
            exact = sum(inputs)
            # stage 1: the one received chunk is off by its sender's step; stage 2: requantization
            step = sum((x.max(axis=1) - x.min(axis=1)) / levels for x in inputs)
            bound = step + (exact.max(axis=1) - exact.min(axis=1) + 2 * step) / levels
            err = np.abs(per_rank[rank][axis] - exact)
            assert (err <= bound[:, None] + 1e-5).all()
            assert err.max() > 0  # it was quantized
            # every member of the group holds the same result
            assert all(np.array_equal(per_rank[m][axis], per_rank[rank][axis]) for m in members)
    for rank in range(4):
        c = list(coords_of(rank, grid))
        partner = [m for m in range(4) if m != rank and list(coords_of(m, grid))[1] == c[1]][0]
        exact = _input(rank, 0).astype(np.float64) + _input(partner, 0)
        assert np.allclose(per_rank[rank]["fp32"], exact, rtol=1e-6, atol=1e-6)
        assert per_rank[rank]["quant_ms"] > 0
        # int8 all-reduce of 6 x 8 on 2 ranks: 2 * (3 * 8 + 8 * 3) = 96; int4: 2 * (3 * 4 + 24) = 72
        assert per_rank[rank]["bytes"] == {"aggregation": 96, "combination": 72, "gather": 0}


# ---------------------------------------------------------------------------------------
# bad input
# ---------------------------------------------------------------------------------------
def test_unknown_precision_is_a_user_error():
    from plexus_tune.trainer import TrainConfig
    from plexus_tune.trainer.run import validate

    with pytest.raises(UserError, match="unknown communication precision 'int3'"):
        validate(TrainConfig(grid=(2, 1, 1), synthetic=SPEC, comm_precision="int3"))


def test_backend_without_uint8_rejects_int2(monkeypatch):
    from plexus_tune.model import comm_precision as cpm

    monkeypatch.setitem(cpm.BACKEND_WIRE_DTYPES, "gloo", ("float32", "bfloat16", "float16"))
    cpm.check_backend("gloo", "bf16")
    with pytest.raises(UserError, match="cannot send uint8, which int2"):
        cpm.check_backend("gloo", "aggregation=int2")
    with pytest.raises(UserError, match="cannot send uint8"):
        cpm.check_backend("mpi", "int8")  # a backend not in the table sends FP32 only


@pytest.mark.parametrize("argv, message", [
    (["train", "--synthetic", SPEC, "--grid", "2x1x1", "--comm-precision", "int3"], "unknown communication precision"),
    (["measure", "--synthetic", SPEC, "--gpus", "2", "--log", "x.jsonl", "--comm-precision", "gather=int9"],
     "unknown communication precision"),
    (["train", "--synthetic", SPEC, "--grid", "2x1x1", "--comm-precision", "bogus=int2"], "unknown collective class"),
])
def test_cli_bad_precision_exits_2_in_one_line(argv, message, capsys, tmp_path, monkeypatch):
    from plexus_tune.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "--comm-precision" in err
    assert not (tmp_path / "x.jsonl").exists()


def test_cli_backend_without_uint8_exits_2(capsys, monkeypatch):
    from plexus_tune.model import comm_precision as cpm
    from plexus_tune.cli import main

    monkeypatch.setitem(cpm.BACKEND_WIRE_DTYPES, "gloo", ("float32",))
    assert main(["train", "--synthetic", SPEC, "--grid", "2x1x1", "--comm-precision", "int2"]) == 2
    err = capsys.readouterr().err
    assert "gloo backend cannot send uint8" in err and err.count("\n") == 1


def test_fixed_features_drop_layer0_feature_gradient_bytes(sent):
    # Fixed features drop layer 0's dH all-reduce over outer (2x1x1: 4096 of the 8192), and
    # over depth (1x1x2) the backward all-gather of W (128) and the reduce-scatter of dF (2048):
    # 4496 - 2176 = 2320. The forward, db and dW are unchanged.
    for rank_bytes in _per_rank(sent, (2, 1, 1), "fixed"):
        assert rank_bytes == {"aggregation": 4096, "combination": 0, "gather": 0}
    for rank_bytes in _per_rank(sent, (1, 1, 2), "fixed"):
        assert rank_bytes == {"aggregation": 0, "combination": 0, "gather": 2320}
