"""The collective cost module: ring terms, placement, the network forms, and that fit and
predict evaluate the same formula.

Toy network (4 GPUs per node): alpha_intra 10 us, beta_intra 100 GB/s, alpha_inter 20 us,
beta_inter 40 GB/s; M = 1e6 bytes. Times in ms: alpha_us * 1e-3, bytes / (GB/s * 1e9) * 1e3.
"""

import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from plexus_tune.errors import UserError
from plexus_tune.fit.collectives import fit_collectives, frame_placement, size_groups
from plexus_tune.measure.collectives import collective_shapes, partition
from plexus_tune.model import costs
from plexus_tune.model import machine as machine_module
from plexus_tune.model.collectives import (
    COLLECTIVE_OPS,
    Network,
    bus_bandwidth_gbps,
    nodes_spanned,
    placement,
    ring_terms,
    scale_collectives,
)
from plexus_tune.model.grid import enumerate_grids
from plexus_tune.model.machine import Machine, collective_time_ms, load_machine
from plexus_tune.model.workload import Workload

TOY = {"alpha_intra_us": 10.0, "beta_intra_gbps": 100.0, "alpha_inter_us": 20.0, "beta_inter_gbps": 40.0}
M = 1e6
US = 1e-3  # ms per us


def bw(nbytes, gbps):
    return nbytes / (gbps * 1e9) * 1e3


def net(form="two-tier", sharing=True, n=4, **extra):
    return Network.from_dict({**TOY, "form": form, "sharing": sharing, **extra}, n)


def one(network, op, g, p, m_bytes=M, messages=1):
    return float(network.time_ms(op, g, p, m_bytes, messages))


# ----------------------------------------------------------------------------- ring terms, placement


def test_ring_terms_and_nccl_tests_bandwidths():
    steps, factor = ring_terms(np.array(["all_reduce", "all_gather", "reduce_scatter"]), np.array([4, 4, 8]))
    np.testing.assert_allclose(steps, [6, 3, 7])
    np.testing.assert_allclose(factor, [1.5, 0.75, 7 / 8])
    algbw, busbw = bus_bandwidth_gbps("all_reduce", 8, 2e9, 1000.0)  # 2 GB in 1 s
    assert (float(algbw), float(busbw)) == pytest.approx((2.0, 3.5))
    assert json.dumps([algbw, busbw])  # plain floats for records
    with pytest.raises(UserError, match="unknown collective op .gather."):
        ring_terms("gather", 2)


def test_placement_is_the_largest_over_the_groups_of_an_axis():
    # brute force: split the ranks into the axis' groups, count nodes, ranks per node and the
    # groups that meet on node 0; exact whenever p g and n divide one another
    checked = 0
    for n in (2, 4, 8):
        for world in (8, 16, 32, 64):
            for g, p in collective_shapes(world):
                if n % (p * g) and (p * g) % n:
                    continue
                groups = partition(world, g, p)
                k = max(nodes_spanned(m, n) for m in groups)
                r = max(max(Counter(x // n for x in m).values()) for m in groups)
                sharing_node0 = sum(any(x // n == 0 for x in m) for m in groups)
                place = placement(g, p, n)
                assert (int(place.nodes), int(place.ranks_per_node)) == (k, r), (n, world, g, p)
                if k > 1:
                    assert int(place.concurrent) == sharing_node0 == min(n, p), (n, world, g, p)
                checked += 1
    assert checked > 100
    # intra exactly when p g <= n, as the two-tier model has always said (also when irregular)
    for g, p in collective_shapes(48):
        assert (int(placement(g, p, 8).nodes) == 1) == (p * g <= 8)


# ----------------------------------------------------------------------------- forms by hand


def test_two_tier_by_hand():
    tt = net()
    # g = 8 contiguous over 2 nodes of 4: one group per node, nothing shared
    assert one(tt, "all_reduce", 8, 1) == pytest.approx(14 * 20 * US + 14 / 8 * bw(M, 40), rel=1e-12)
    # g = 2 at stride 4: 4 groups share each node's NIC -> 40 / 4 GB/s
    assert one(tt, "all_gather", 2, 4) == pytest.approx(20 * US + 0.5 * bw(M, 10), rel=1e-12)
    assert one(net(sharing=False), "all_gather", 2, 4) == pytest.approx(20 * US + 0.5 * bw(M, 40), rel=1e-12)
    # inside a node (2 * 2 <= 4), messages pay latency each
    assert one(tt, "reduce_scatter", 2, 2, messages=3) == pytest.approx(3 * 10 * US + 0.5 * bw(M, 100), rel=1e-12)
    assert one(tt, "all_reduce", 1, 4) == 0.0
    assert float(tt.effective_beta_gbps("all_reduce", 4, 2)) == 20.0  # 40 / min(4, 2)


def test_hierarchical_step_counts_by_hand():
    h = net("hierarchical")
    # g = 8, p = 1 on nodes of 4: k = 2 nodes, r = 4 local ranks, s = 1
    # all-reduce: RS among 4 (3 steps, 3/4 M), AR among 2 nodes on M / 4 by each of 4 local
    # rings (2 steps, 2 (1/2) (M/4) at 40/4 GB/s each = M / 40), AG among 4 (3 steps, 3/4 M)
    ar = 6 * 10 * US + 2 * 20 * US + 1.5 * bw(M, 100) + 1.0 * bw(M, 40)
    assert one(h, "all_reduce", 8, 1) == pytest.approx(ar, rel=1e-12)
    ag = 3 * 10 * US + 1 * 20 * US + 0.75 * bw(M, 100) + 0.5 * bw(M, 40)
    assert one(h, "all_gather", 8, 1) == pytest.approx(ag, rel=1e-12)
    assert one(h, "reduce_scatter", 8, 1, messages=2) == pytest.approx(ag + 3 * 10 * US + 1 * 20 * US, rel=1e-12)
    # g = 4 at stride 2: k = 2, r = 2, s = min(4, 2) = 2 groups per node
    rs = 1 * 10 * US + 1 * 20 * US + 0.5 * bw(M, 100) + 0.5 * bw(2 * M, 40)
    assert one(h, "reduce_scatter", 4, 2) == pytest.approx(rs, rel=1e-12)
    assert one(net("hierarchical", sharing=False), "reduce_scatter", 4, 2) == pytest.approx(rs - 0.5 * bw(M, 40), rel=1e-12)
    # 16 over 4 nodes: k = 4, r = 4
    assert one(h, "all_gather", 16, 1) == pytest.approx(3 * 10 * US + 3 * 20 * US + 0.75 * bw(M, 100) + 0.75 * bw(M, 40), rel=1e-12)
    # equal to the intra ring inside a node and to the two-tier inter ring with one rank per node
    tt = net()
    for g, p in ((4, 1), (2, 2), (2, 4), (4, 4), (4, 8)):
        for op in COLLECTIVE_OPS:
            assert one(h, op, g, p) == pytest.approx(one(tt, op, g, p), rel=1e-12)
    assert float(h.effective_beta_gbps("all_gather", 8, 1)) == pytest.approx((7 / 8) / (0.75 / 100 + 0.5 / 40))


def test_per_span_entries_and_fallback_by_hand():
    entries = [
        {"op": "all_gather", "group": 8, "nodes": 2, "stride": 3, "alpha_us": 1.0, "beta_gbps": 1.0},  # no such stride here
        {"op": "all_gather", "group": 8, "nodes": 2, "alpha_us": 5.0, "beta_gbps": 30.0},
        {"op": "all_reduce", "group": 2, "nodes": 2, "alpha_us": 7.0, "beta_gbps": 80.0},
        {"op": "all_reduce", "group": 2, "nodes": 2, "alpha_us": 99.0, "beta_gbps": 99.0},  # shadowed: first match wins
    ]
    ps = net("per-span", per_span=entries)
    assert one(ps, "all_gather", 8, 1) == pytest.approx(7 * 5 * US + 7 / 8 * bw(M, 30), rel=1e-12)
    assert one(ps, "all_gather", 8, 1, messages=4) == pytest.approx(4 * 7 * 5 * US + 7 / 8 * bw(M, 30), rel=1e-12)
    # g = 2 at stride 4: s = 4 groups share a node: beta 80 / 4
    assert one(ps, "all_reduce", 2, 4) == pytest.approx(2 * 7 * US + 1.0 * bw(M, 20), rel=1e-12)
    assert one(net("per-span", sharing=False, per_span=entries), "all_reduce", 2, 4) == pytest.approx(2 * 7 * US + bw(M, 80), rel=1e-12)
    # shapes no entry covers: the two-tier formula
    tt = net()
    for op, g, p in (("reduce_scatter", 8, 1), ("all_gather", 4, 1), ("all_reduce", 4, 2)):
        assert one(ps, op, g, p) == pytest.approx(one(tt, op, g, p), rel=1e-12)
    assert float(ps.effective_beta_gbps("all_reduce", 2, 4)) == pytest.approx(20.0)


def test_profiles_round_trip_scale_and_reject_bad_input():
    shapes = [(g, p) for g, p in collective_shapes(32)]
    g = np.array([s[0] for s in shapes])
    p = np.array([s[1] for s in shapes])
    profiles = [
        {**TOY},
        {**TOY, "sharing": False, "bandwidth_table": [{"stride": [1, 2], "group": [2, None], "beta_gbps": 7.0, "ops": ["all_gather"]}]},
        {**TOY, "form": "hierarchical"},
        {**TOY, "form": "per-span", "per_span": [{"op": "all_gather", "group": 4, "nodes": 2, "stride": 2, "alpha_us": 3.0, "beta_gbps": 9.0}]},
    ]
    for data in profiles:
        a = Network.from_dict(data, 4)
        b = Network.from_dict(json.loads(json.dumps(a.to_dict())), 4)
        c = Network.from_dict(scale_collectives(a.to_dict(), 2.5), 4)
        for op in COLLECTIVE_OPS:
            ta = a.time_ms(op, g, p, M, 3)
            np.testing.assert_allclose(b.time_ms(op, g, p, M, 3), ta, rtol=1e-15)
            np.testing.assert_allclose(c.time_ms(op, g, p, M, 3), 2.5 * ta, rtol=1e-12)
            np.testing.assert_allclose(a.scaled(2.5).time_ms(op, g, p, M, 3), 2.5 * ta, rtol=1e-12)
    bad = [
        ({**TOY, "form": "tree"}, "collectives.form"),
        ({**TOY, "sharing": "yes"}, "collectives.sharing"),
        ({**TOY, "form": "per-span"}, "collectives.per_span"),
        ({**TOY, "per_span": [{"op": "all_gather", "group": 4, "nodes": 2, "alpha_us": 1, "beta_gbps": 1}]}, "only by form per-span"),
        ({**TOY, "form": "hierarchical", "bandwidth_table": []}, "not hierarchical"),
        ({**TOY, "form": "per-span", "per_span": [{"op": "gather", "group": 4, "nodes": 2, "alpha_us": 1, "beta_gbps": 1}]}, "per_span[0].op"),
        ({**TOY, "form": "per-span", "per_span": [{"op": "all_gather", "group": 4, "nodes": 0, "alpha_us": 1, "beta_gbps": 1}]}, "per_span[0].nodes"),
        ({**TOY, "form": "per-span", "per_span": [{"op": "all_gather", "group": 4, "nodes": 1, "alpha_us": 1, "beta_gbps": 0}]}, "beta_gbps"),
    ]
    for data, needle in bad:
        with pytest.raises(UserError, match=needle.replace("[", r"\[").replace("]", r"\]")) as exc:
            Network.from_dict(data, 4, source="x.json")
        assert "\n" not in str(exc.value)


# ----------------------------------------------------------------------------- shipped profiles unchanged


def _old_two_tier_ms(coll, n, op, g, p, m_bytes, messages):
    """The two-tier formula as profiles have always meant it, one shape at a time."""
    if g <= 1:
        return 0.0
    if op == "reduce_scatter" and coll.get("reduce_scatter_form") == "all_reduce":
        op = "all_reduce"  # the backend all-reduces the whole buffer and keeps its block
    steps = 2 * (g - 1) if op == "all_reduce" else g - 1
    if p * g <= n:
        alpha, beta = coll["alpha_intra_us"], coll["beta_intra_gbps"]
    else:
        alpha, beta = coll["alpha_inter_us"], coll["beta_inter_gbps"] / min(n, p)
    for e in coll.get("bandwidth_table") or []:
        lo_p, hi_p = (e["stride"], e["stride"]) if isinstance(e["stride"], int) else e["stride"]
        lo_g, hi_g = (e["group"], e["group"]) if isinstance(e["group"], int) else e["group"]
        if op in e.get("ops", COLLECTIVE_OPS) and lo_p <= p <= (hi_p or math.inf) and lo_g <= g <= (hi_g or math.inf):
            beta = e["beta_gbps"]
            break
    return steps * alpha * messages * 1e-3 + steps / g * m_bytes / (beta * 1e9) * 1e3


def _two_tier_profiles():
    """The shipped profiles of form two-tier with sharing (the others are fitted forms)."""
    paths = sorted((Path(__file__).resolve().parents[1] / "models").glob("*.json"))
    out = []
    for path in paths:
        coll = json.loads(path.read_text())["collectives"]
        if coll.get("form", "two-tier") == "two-tier" and coll.get("sharing", True):
            out.append(path)
    return out


def test_shipped_two_tier_profiles_include_the_hand_written_ones():
    assert {"perlmutter", "perlmutter-paper", "frontier", "cpu-gloo-2core"} <= {p.stem for p in _two_tier_profiles()}


@pytest.mark.parametrize("path", _two_tier_profiles(), ids=lambda p: p.stem)
def test_shipped_profiles_predict_what_the_two_tier_formula_says(path):
    machine = load_machine(path)
    coll, n = json.loads(path.read_text())["collectives"], machine.gpus_per_node
    assert machine.network.form == "two-tier" and machine.network.sharing
    shapes = sorted({s for world in (8, 12, 48, 64, 256) for s in collective_shapes(world)})
    g = np.array([s[0] for s in shapes])
    p = np.array([s[1] for s in shapes])
    for op in COLLECTIVE_OPS:
        for m_bytes, messages in ((1.0, 1), (4096.0, 7), (3e6, 1), (2e9, 3)):
            got = collective_time_ms(machine, op, g, p, m_bytes, messages)
            want = [_old_two_tier_ms(coll, n, op, int(a), int(b), m_bytes, messages) for a, b in zip(g, p)]
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)


# ----------------------------------------------------------------------------- fit = predict

N = 4
TRUTH = {"alpha_intra_us": 20.0, "beta_intra_gbps": 100.0, "alpha_inter_us": 50.0, "beta_inter_gbps": 20.0}
SIZES = [65536 * 2**i for i in range(11)]  # 64 KiB .. 64 MiB


def synthetic(time_fn, *, seed, noise=0.03, ops=("all_gather", "reduce_scatter")):
    """16 ranks on nodes of 4: every axis shape of a grid of 16 (groups of 2 and 4 inside a node,
    8 over 2 nodes, 16 over 4, and strided groups sharing nodes), 64 KiB .. 64 MiB."""
    rng = np.random.default_rng(seed)
    rows = []
    for g, p in collective_shapes(16):
        k = int(placement(g, p, N).nodes)
        for op in ops:
            for m_bytes in SIZES:
                rows.append({"op": op, "group_size": g, "stride": p, "nodes": k, "message_bytes": m_bytes, "gpus_per_node": N})
    df = pd.DataFrame(rows)
    df["time_ms"] = time_fn(df) * (1.0 + noise * rng.standard_normal(len(df)))
    return df


def network_times(network):
    return lambda df: network.time_ms(df["op"].to_numpy(), df["group_size"], df["stride"], df["message_bytes"])


@pytest.mark.parametrize("form,table", [("two-tier", False), ("two-tier", True), ("per-span", False), ("hierarchical", False)])
@pytest.mark.parametrize("sharing", [True, False])
def test_a_fitted_profile_predicts_what_the_fit_predicts(form, table, sharing, monkeypatch):
    truth = Network.from_dict({**TRUTH, "form": "hierarchical"}, N)
    df = synthetic(network_times(truth), seed=3, ops=COLLECTIVE_OPS)
    model = fit_collectives(df, n_splits=0, form=form, table=table, sharing=sharing)
    assert model.form == form and model.network.sharing is sharing and bool(model.table) is table
    machine = Machine.from_dict({"name": "fitted", "gpus_per_node": N, "device_memory_gib": 16, "gemm_tflops": 1.0,
                                 "spmm": {"kind": "paper", "c0": 1e-3, "c1": 0.0, "c2": 0.0},
                                 "collectives": json.loads(json.dumps(model.to_dict()))})
    fitted = model.predict(df)
    for op in COLLECTIVE_OPS:
        rows = df["op"].to_numpy() == op
        got = collective_time_ms(machine, op, df["group_size"][rows], df["stride"][rows], df["message_bytes"][rows])
        np.testing.assert_allclose(got, fitted[rows], rtol=1e-12, atol=0)
    # the cost model's collectives are the same function: record its calls on every grid of 16
    calls = []
    original = machine_module.collective_time_ms

    def recorded(machine_, op, group_size, stride, message_bytes, messages=1):
        t = original(machine_, op, group_size, stride, message_bytes, messages)
        calls.append((op, *np.broadcast_arrays(group_size, stride, message_bytes, messages), t))
        return t

    monkeypatch.setattr(machine_module, "collective_time_ms", recorded)
    pred = costs.predict_grids(Workload("toy", nodes=100_000, nnz=2_000_000, widths=(64, 32, 8)), machine, enumerate_grids(16), block_rows=5000)
    assert calls and np.allclose(pred["comm_ms"], sum(c[-1] for c in calls), rtol=1e-12)
    for op, g, p, m_bytes, messages, t in calls:
        frame = pd.DataFrame({"op": op, "group_size": g, "stride": p, "nodes": placement(g, p, N).nodes,
                              "message_bytes": m_bytes, "messages": messages})
        np.testing.assert_allclose(model.predict(frame), t, rtol=1e-12, atol=0)
    assert any(np.any(placement(c[1], c[2], N).nodes > 1) for c in calls)  # some groups crossed nodes


@pytest.mark.parametrize("form", ["two-tier", "per-span", "hierarchical"])
@pytest.mark.parametrize("sharing", [True, False])
def test_noiseless_timings_come_back_exactly(form, sharing):
    # the fit's least squares uses the terms predict evaluates: data made by a form is fitted exactly
    truth = Network.from_dict({**TRUTH, "form": "hierarchical" if form == "hierarchical" else "two-tier", "sharing": sharing}, N)
    df = synthetic(network_times(truth), seed=0, noise=0.0, ops=COLLECTIVE_OPS)
    model = fit_collectives(df, n_splits=0, form=form, sharing=sharing)
    np.testing.assert_allclose(model.predict(df), df["time_ms"], rtol=1e-6)
    for key, value in TRUTH.items():
        assert getattr(model.network, key) == pytest.approx(value, rel=1e-6), key
    if form == "per-span":  # one entry per (op, group size, nodes spanned), each the truth's ring
        assert len(model.network.entries) == len({(o, g, k) for o, g, k in zip(df["op"], df["group_size"], df["nodes"])})
        for e in model.network.entries:
            tier = "inter" if e["nodes"] > 1 else "intra"
            assert (e["alpha_us"], e["beta_gbps"]) == pytest.approx((TRUTH[f"alpha_{tier}_us"], TRUTH[f"beta_{tier}_gbps"]), rel=1e-6)


# ----------------------------------------------------------------------------- recovery on synthetic data


@pytest.mark.parametrize("form", ["two-tier", "hierarchical"])
def test_fit_recovers_a_multi_node_network_and_predicts_left_out_sizes(form):
    truth = Network.from_dict({**TRUTH, "form": form}, N)
    df = synthetic(network_times(truth), seed=1)
    model = fit_collectives(df, n_splits=10)
    assert model.name == form  # the generating form has the lowest leave-sizes-out MAPE
    for key, value in TRUTH.items():
        assert getattr(model.network, key) == pytest.approx(value, rel=0.05), key
    assert model.scores["sizes_out_mape"] < 15 and model.scores["sizes_out_sizes"] == len(SIZES)
    assert model.scores["test_mape"] < 15
    # with the NIC shared by min(n, p) groups left out, held-out sizes are missed by far more
    assert model.all_scores[f"{form}/no-sharing"]["sizes_out_mape"] > 2 * model.scores["sizes_out_mape"]


def test_auto_picks_a_form_that_fits_per_op_and_group_alpha_beta():
    rng = np.random.default_rng(7)
    ab = {(op, g): (rng.uniform(5, 100), rng.uniform(2, 200)) for op in ("all_gather", "reduce_scatter") for g in (2, 4, 8, 16)}

    def plain_alpha_beta(df):
        a, b = np.array([ab[(o, g)] for o, g in zip(df["op"], df["group_size"])]).T
        return a * 1e-3 + bw(df["message_bytes"].to_numpy(), b)

    df = synthetic(plain_alpha_beta, seed=2)
    model = fit_collectives(df, n_splits=10)
    assert model.all_scores["two-tier"]["sizes_out_mape"] > 30  # one alpha-beta per tier cannot follow it
    assert model.form == "per-span" and model.scores["sizes_out_mape"] < 15
    assert set(model.all_scores) >= {"two-tier", "two-tier/no-sharing", "per-span", "hierarchical", "hierarchical/no-sharing"}


def test_placement_from_logs_without_stride():
    df = pd.DataFrame({"op": ["all_gather"] * 3, "group_size": [8, 2, 4], "nodes_spanned": [2, 2, 1], "message_bytes": [1e6] * 3})
    place, mismatches = frame_placement(df, 4)
    assert list(place.nodes) == [2, 2, 1] and list(place.ranks_per_node) == [4, 1, 4] and mismatches == 0
    assert list(place.concurrent[:2]) == [1, 4] and place.stride is None  # n // r across nodes
    df["stride"] = [1, 4, 2]  # (4, 2) spans 2 nodes of 4: the log's 1 disagrees
    place, mismatches = frame_placement(df, 4)
    assert list(place.nodes) == [2, 2, 2] and mismatches == 1
    assert list(size_groups([1020, 1024, 4092, 4096, 4096 * 1.2])) == [0, 0, 1, 1, 2]


def test_fit_rejects_bad_arguments():
    df = synthetic(network_times(Network.from_dict(TRUTH, N)), seed=0)
    with pytest.raises(UserError, match="unknown collective model form 'ring'"):
        fit_collectives(df, form="ring")
    with pytest.raises(UserError, match="gpus_per_node must be a positive integer"):
        fit_collectives(df, gpus_per_node=0)
    with pytest.raises(UserError, match="missing column 'stride'"):
        fit_collectives(df.drop(columns="stride"), table=True)


def test_per_span_fits_only_what_a_key_was_timed_at():
    truth = Network.from_dict(TRUTH, N)
    df = synthetic(network_times(truth), seed=0, noise=0.0)
    small = (df["op"] == "all_gather") & (df["group_size"] == 16)  # latency-bound below 1 MiB
    large = (df["op"] == "reduce_scatter") & (df["group_size"] == 8) & (df["stride"] == 1)
    df = df[~(small & (df["message_bytes"] > 2**18)) & ~(large & (df["message_bytes"] < 2**24))].reset_index(drop=True)
    small = (df["op"] == "all_gather") & (df["group_size"] == 16)
    large = (df["op"] == "reduce_scatter") & (df["group_size"] == 8) & (df["stride"] == 1)
    slow_latency = Network.from_dict({**TRUTH, "alpha_inter_us": 1.5 * TRUTH["alpha_inter_us"]}, N)
    slow_bandwidth = Network.from_dict({**TRUTH, "beta_inter_gbps": TRUTH["beta_inter_gbps"] / 1.2}, N)
    df.loc[small, "time_ms"] = network_times(slow_latency)(df[small])
    df.loc[large, "time_ms"] = network_times(slow_bandwidth)(df[large])
    model = fit_collectives(df, n_splits=0, form="per-span", sharing=True)
    entries = {(e["op"], e["group"], e["nodes"]): e for e in model.network.entries}
    net = model.network
    e = entries[("all_gather", 16, 4)]  # timed at 64..256 KiB: alpha fitted, the tier's beta kept
    assert e["beta_gbps"] == pytest.approx(net.beta_inter_gbps, rel=1e-12)
    assert e["alpha_us"] == pytest.approx(1.5 * TRUTH["alpha_inter_us"], rel=0.02)
    e = entries[("reduce_scatter", 8, 2)]  # timed at 16..64 MiB: beta fitted, the tier's alpha kept
    assert e["alpha_us"] == pytest.approx(net.alpha_inter_us, rel=1e-12)
    assert e["beta_gbps"] == pytest.approx(TRUTH["beta_inter_gbps"] / 1.2, rel=0.03)
    e = entries[("all_gather", 8, 2)]  # timed on both sides of its crossover: both fitted
    assert (e["alpha_us"], e["beta_gbps"]) == pytest.approx((TRUTH["alpha_inter_us"], TRUTH["beta_inter_gbps"]), rel=1e-6)


def test_a_backend_that_reduces_the_whole_buffer_times_its_reduce_scatter_as_an_all_reduce():
    """gloo's reduce_scatter_tensor all-reduces the input and keeps a block: with
    reduce_scatter_form all_reduce, a reduce-scatter of M on 8 ranks over 2 nodes of 4 costs
    14 x 20 us + 14/8 M / 40 GB/s (the all-reduce of M), not 7 x 20 us + 7/8 M / 40 GB/s."""
    ring, whole = net(), net(reduce_scatter_form="all_reduce")
    assert one(ring, "reduce_scatter", 8, 1) == pytest.approx(7 * 20 * US + 7 / 8 * bw(M, 40), rel=1e-12)
    assert one(whole, "reduce_scatter", 8, 1) == pytest.approx(14 * 20 * US + 14 / 8 * bw(M, 40), rel=1e-12)
    assert one(whole, "all_gather", 8, 1) == one(ring, "all_gather", 8, 1)  # nothing else changes
    assert whole.to_dict()["reduce_scatter_form"] == "all_reduce" and "reduce_scatter_form" not in ring.to_dict()
    assert Network.from_dict(whole.to_dict(), 4) == whole
    with pytest.raises(UserError, match="reduce_scatter_form must be one of ring, all_reduce"):
        net(reduce_scatter_form="halving")


@pytest.mark.parametrize("rs_form", ["ring", "all_reduce"])
def test_the_fit_finds_how_the_backend_runs_a_reduce_scatter(rs_form):
    truth = Network.from_dict({**TRUTH, "reduce_scatter_form": rs_form}, N)
    df = synthetic(network_times(truth), seed=0, noise=0.0, ops=COLLECTIVE_OPS)
    model = fit_collectives(df, n_splits=0, form="two-tier", sharing=True)
    assert model.network.reduce_scatter_form == rs_form and model.reduce_scatter_fit["form"] == rs_form
    assert model.reduce_scatter_fit["rows"] == int((df["op"] == "reduce_scatter").sum())
    other = "ring" if rs_form == "all_reduce" else "all_reduce"
    assert model.reduce_scatter_fit["mape"][rs_form] < 1e-6 < model.reduce_scatter_fit["mape"][other]
    np.testing.assert_allclose(model.predict(df), df["time_ms"], rtol=1e-6)
    for key, value in TRUTH.items():
        assert getattr(model.network, key) == pytest.approx(value, rel=1e-6), key
