"""ScaleGNN's 4D mini-batch trainer (trainer/scalegnn): one step equals serial PyTorch
Geometric on the same samples for every Gd x grid of G <= 8, sampling runs no collective,
data-parallel groups train on different samples and step one model, mini-batch training
of a planted-communities graph reaches the full-graph trainer's accuracy."""

import itertools

import numpy as np
import pytest
import scipy.sparse as sp

from plexus_tune.graph import Graph
from plexus_tune.launch import launch_local
from plexus_tune.model.grid import enumerate_grids
from plexus_tune.trainer import TrainConfig
from plexus_tune.trainer.algorithms import normalize_config
from plexus_tune.trainer.rank import rank_main
from plexus_tune.trainer.reference import max_relative_difference, reference_minibatch_step
from test_trainer import tiny_graph

PRELOAD = ("torch._dynamo", "plexus_tune.trainer.rank")
BATCH, HIDDEN = 20, 9  # of the 37-node graph; 9 columns: no axis of size 2..8 but 3 divides them
TOL = 1e-9  # float64


def configs_of(gpus: int, **extra) -> list[TrainConfig]:
    """Every Gd x (Gx x Gy x Gz) = ``gpus``, one step checked, float64; components, fixed or trained
    input features and prefetch varied with the grid."""
    out = []
    for dp in (d for d in range(1, gpus + 1) if gpus % d == 0):
        for k, grid in enumerate(enumerate_grids(gpus // dp).tolist()):
            minibatch = [{"dropout": 0.25}, {"rmsnorm": False, "residual": True}, {"residual": False}][k % 3]
            minibatch["prefetch"] = k % 2 == 0
            out.append(normalize_config(TrainConfig(
                algorithm="scalegnn-4d", grid=tuple(grid), dp=dp, batch_size=BATCH, hidden=HIDDEN, layers=3,
                epochs=1, warmup=0, seed=5, dtype="float64", check=True, fixed_features=k % 2 == 1,
                extra={"minibatch": minibatch, **extra})))
    return out


def run(graph, gpus, configs, timeout_s=600):
    return launch_local(rank_main, gpus, args=(graph, configs, "cpu"), timeout_s=timeout_s, threads_per_rank=1,
                        preload=PRELOAD)[0]


@pytest.fixture(scope="module")
def graph():
    return tiny_graph()


def _check_against_reference(graph, config, result):
    got = result["check_step"]
    samples = [g["sample"] for g in got["groups"]]
    assert len(samples) == config.dp
    for a, b in itertools.combinations(samples, 2):  # groups train on different samples
        assert not np.array_equal(a, b)
    options = config.extra["minibatch"]
    ref = reference_minibatch_step(graph, samples, layers=config.layers, hidden=config.hidden, seed=config.seed,
                                   dtype="float64", split=result["split_codes"],
                                   rmsnorm=options.get("rmsnorm", True), residual=options.get("residual", True),
                                   dropout=options.get("dropout", 0.0), fixed_features=config.fixed_features)
    what = f"Gd {config.dp} grid {config.grid} {options}"
    assert max_relative_difference([g["loss"] for g in got["groups"]], ref["losses"]) < TOL, what
    assert max_relative_difference(got["logits"], ref["logits"], normwise=True) < TOL, what
    assert set(got["grads"]) == set(ref["grads"]), what
    for name, want in ref["grads"].items():  # after the data-parallel average: the mean of the groups' gradients
        assert np.abs(want).max() > 0, (what, name)
        assert max_relative_difference(got["grads"][name], want, normwise=True) < TOL, (what, name)


@pytest.mark.parametrize("gpus", [
    pytest.param(1, marks=pytest.mark.slow), pytest.param(2, marks=pytest.mark.slow), 3,
    pytest.param(4, marks=pytest.mark.slow), pytest.param(5, marks=pytest.mark.slow),
    pytest.param(6, marks=pytest.mark.slow), pytest.param(7, marks=pytest.mark.slow),
    pytest.param(8, marks=pytest.mark.slow)])
def test_one_step_equals_serial_pyg_for_every_gd_and_grid(gpus, graph):
    configs = configs_of(gpus)
    results = run(graph, gpus, configs)
    for config, result in zip(configs, results):
        _check_against_reference(graph, config, result)
        # the timers partition each rank's epoch; the data-parallel all-reduce is timed where Gd > 1
        for per_rank in result["timers"]:
            row = per_rank[0]
            assert row["spmm_ms"] > 0 and row["gemm_ms"] > 0
            assert row["spmm_ms"] + row["gemm_ms"] + row["comm_ms"] + row["quant_ms"] <= row["epoch_ms"] * 1.001
            assert (row.get("comm_dp_ms", 0.0) > 0) == (config.dp > 1)


def test_prefetched_samples_equal_the_samples_drawn_in_step(graph):
    """Training with the sampling of step t + 1 on a background thread during step t gives the
    same samples, hence bit-identical losses and accuracies, as drawing each sample in its step."""
    common = dict(algorithm="scalegnn-4d", grid=(1, 1, 2), dp=2, batch_size=12, hidden=HIDDEN, layers=3, epochs=3,
                  warmup=0, seed=7, dtype="float64")
    configs = [normalize_config(TrainConfig(prefetch=on, extra={"minibatch": {"dropout": 0.1}}, **common))
               for on in (True, False)]
    assert configs[0].batch_size * configs[0].dp < graph.num_nodes  # several steps per epoch
    on, off = run(graph, 4, configs)
    assert on["losses"] == off["losses"] and len(on["losses"]) == 3
    assert on["accuracy"] == off["accuracy"]
    for per_rank in on["timers"]:
        for row in per_rank:
            assert row["sample_work_ms"] > 0
    for per_rank in off["timers"]:  # drawn in its step: all of the sampling is exposed
        for row in per_rank:
            assert row["sample_ms"] >= row["sample_work_ms"] > 0


class _NoCollectives:
    """Stands in for the process groups: any use is a collective during sampling."""

    def __getattr__(self, name):
        raise AssertionError(f"sampling used the communicator ({name})")


def test_sampling_runs_no_collective(graph, monkeypatch):
    import torch.distributed as dist

    from plexus_tune.graph import gcn_normalize
    from plexus_tune.graph.sampling import sampled_subgraph
    from plexus_tune.model.grid import layer_roles
    from plexus_tune.trainer.scalegnn import ScaleGnnTrainer

    for name in ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast", "send",
                 "recv", "barrier", "all_to_all", "new_group"):
        monkeypatch.setattr(dist, name, _NoCollectives().__getattr__, raising=False)
    adjacency = gcn_normalize(graph.adjacency)
    n = adjacency.shape[0]
    grid = (2, 3, 2)
    rebuilt = {}
    for local in range(12):  # every rank of one group samples alone; their blocks assemble to A_S
        trainer = object.__new__(ScaleGnnTrainer)
        trainer.comm = _NoCollectives()
        trainer.nodes, trainer.grid, trainer.group, trainer.batch = n, grid, 1, BATCH
        trainer.config = TrainConfig(seed=5)
        trainer.dtype = __import__("torch").float64
        trainer.device = __import__("torch").device("cpu")
        x, rest = divmod(local % 6, 3)
        trainer.coords = (x, rest, local // 6)
        trainer.graph_shards = []
        for i in range(3):
            o, _, d = layer_roles(i)
            rows, cols = trainer.node_block(d), trainer.node_block(o)
            trainer.graph_shards.append((rows.start, cols.start, adjacency[rows.start:rows.stop, cols.start:cols.stop]))
        sample = trainer.sample(4)
        for i, (a, _) in enumerate(trainer.sampled_shards(sample)):
            o, _, d = layer_roles(i)
            r0, r1 = sample.rows(d, trainer.coords[d])
            c0, c1 = sample.rows(o, trainer.coords[o])
            block = rebuilt.setdefault(i, np.zeros((BATCH, BATCH)))
            block[r0:r1, c0:c1] = a.to_dense().numpy()
    want = sampled_subgraph(adjacency, sample.vertices).toarray()
    for i in range(3):
        assert np.allclose(rebuilt[i], want)


def planted_communities(n_per=150, k=4, p_in=0.08, p_out=0.004, features=8, signal=1.0, seed=0) -> Graph:
    """k communities of ``n_per`` nodes (edges inside with p_in, across with p_out), labels the
    community, features Gaussian noise plus ``signal`` on the community's coordinate."""
    rng = np.random.default_rng(seed)
    n = n_per * k
    community = np.repeat(np.arange(k), n_per)
    prob = np.where(community[:, None] == community[None, :], p_in, p_out)
    upper = np.triu(rng.random((n, n)) < prob, 1)
    adjacency = sp.csr_matrix((upper | upper.T).astype(np.float32))
    x = rng.standard_normal((n, features)).astype(np.float32)
    x[np.arange(n), community] += signal
    perm = rng.permutation(n)
    return Graph(adjacency=adjacency[perm][:, perm].tocsr(), features=x[perm],
                 labels=community[perm].astype(np.int64), num_classes=k, name="planted")


#: Mini-batch epochs (B = N / 2, 2 steps each) within which the mini-batch trainer reaches the
#: full-graph trainer's test accuracy after 60 epochs (both: 2 layers, width 16, AdamW 0.01).
MINIBATCH_EPOCHS = 40


def test_minibatch_reaches_the_full_graph_accuracy():
    g = planted_communities()
    common = dict(hidden=16, layers=2, lr=0.01, seed=0, warmup=0)
    full = normalize_config(TrainConfig(grid=(1, 1, 1), epochs=60, permute="none", **common))
    mini = normalize_config(TrainConfig(grid=(1, 1, 1), algorithm="scalegnn-4d", batch_size=300,
                                        epochs=MINIBATCH_EPOCHS, **common))
    full_result, mini_result = run(g, 1, [full, mini])
    target = full_result["accuracy"]["test"][-1]
    assert target > 0.9  # the labels are learnable
    assert max(mini_result["accuracy"]["test"]) >= target - 0.01
    assert mini_result["losses"][-1] < 0.5 * mini_result["losses"][0]


def test_train_cli_check_passes(run_cli):
    code, out, err = run_cli(["train", "--synthetic", "rmat:nodes=512,edges=4096,features=16,classes=4,seed=0",
                              "--algorithm", "scalegnn-4d", "--dp", "2", "--grid", "2x1x1", "--batch-size", "256",
                              "--check", "--epochs", "2", "--warmup", "1", "--hidden", "16"])
    assert code == 0, err
    assert "PASSED" in out and "scalegnn-4d (Gd = 2, B = 256) grid 2x1x1 (4 ranks" in out


@pytest.mark.parametrize("args,needle", [
    (["--algorithm", "scalegnn-4d", "--grid", "2x1x1"], "--batch-size"),
    (["--algorithm", "scalegnn-4d", "--grid", "2x1x1", "--batch-size", "100000"], "--batch-size"),
    (["--grid", "2x1x1", "--dp", "2"], "--dp"),
    (["--grid", "2x1x1", "--batch-size", "64"], "--batch-size"),
    (["--algorithm", "scalegnn-4d", "--grid", "2x1x1", "--batch-size", "64", "--dropout", "1.5"], "--dropout"),
])
def test_bad_trainer_input_is_one_line_and_exit_2(run_cli, args, needle):
    code, _, err = run_cli(["train", "--synthetic", "rmat:nodes=512,edges=4096,features=16,classes=4,seed=0"] + args)
    assert code == 2 and needle in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_run_cli_trains_and_logs_the_prediction(run_cli, tmp_path):
    import json

    log = tmp_path / "runs.jsonl"
    code, out, err = run_cli(["run", "--graph", "rmat:nodes=512,edges=4096,features=16,classes=4,seed=0", "--gpus", "4",
                              "--algorithm", "scalegnn-4d", "--dp", "2", "--batch-size", "128", "--machine",
                              "cpu-gloo-2core-fitted", "--hidden", "16", "--epochs", "3", "--warmup", "1",
                              "--log", str(log)])
    assert code == 0, err
    record = json.loads(log.read_text().splitlines()[-1])
    assert record["algorithm"] == "scalegnn-4d" and record["gpus"] == 4
    assert record["options"]["dp"] == 2 and record["options"]["batch_size"] == 128
    assert record["predicted"]["total_ms"] > 0


@pytest.mark.parametrize("command,args,needle", [
    ("run", ["--gpus", "4", "--dp", "3", "--batch-size", "64"], "--dp"),
    ("run", ["--gpus", "4", "--dp", "2"], "--batch-size"),
    ("run", ["--gpus", "4", "--dp", "2", "--batch-size", "100000"], "--batch-size"),
    ("measure", ["--gpus", "4", "--dp", "3", "--batch-size", "64", "--log", "runs-never-written.jsonl"], "--dp"),
])
def test_bad_campaign_input_is_one_line_and_exit_2(run_cli, command, args, needle):
    code, _, err = run_cli([command, "--graph", "rmat:nodes=512,edges=4096,features=16,classes=4,seed=0",
                            "--algorithm", "scalegnn-4d", "--machine", "cpu-gloo-2core-fitted"] + args)
    assert code == 2 and needle in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
