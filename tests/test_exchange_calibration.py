"""Broadcast and point-to-point exchanges: nccl-tests' bus bandwidth factors, their per-rank
terms by hand, the fit recovering their own tier parameters from timings made with known
values, and the families timing their broadcasts and exchanges with those parameters.

Toy network (4 ranks per node): collectives alpha_intra 20 us, beta_intra 100 GB/s,
alpha_inter 50 us, beta_inter 20 GB/s; broadcast and point_to_point with other values.
"""

import json

import numpy as np
import pandas as pd
import pytest

from plexus_tune.errors import UserError
from plexus_tune.fit.collectives import fit_collectives
from plexus_tune.measure.collectives import collective_records, collective_shapes
from plexus_tune.model.collectives import (
    ALL_OPS,
    Network,
    bus_bandwidth_gbps,
    exchange_terms,
    placement,
    ring_terms,
    scale_collectives,
)
from plexus_tune.model.family_costs import exchange_stats, point_to_point_ms, schedule_times
from plexus_tune.model.comm_precision import parse_comm_precision
from plexus_tune.model.machine import Machine
from plexus_tune.model.volumes import CommCall, UniformExchange

N = 4
BASE = {"alpha_intra_us": 20.0, "beta_intra_gbps": 100.0, "alpha_inter_us": 50.0, "beta_inter_gbps": 20.0}
OWN = {"broadcast": {"alpha_intra_us": 70.0, "beta_intra_gbps": 40.0, "alpha_inter_us": 300.0, "beta_inter_gbps": 5.0},
       "point_to_point": {"alpha_intra_us": 15.0, "beta_intra_gbps": 60.0, "alpha_inter_us": 120.0, "beta_inter_gbps": 8.0}}
SIZES = [65536 * 2**i for i in range(9)]


def ms(alpha_us=0.0, nbytes=0.0, gbps=1.0):
    return alpha_us * 1e-3 + nbytes / (gbps * 1e9) * 1e3


def toy(op_tiers=OWN, sharing=True):
    return Network.from_dict({**BASE, "sharing": sharing, **({"op_tiers": op_tiers} if op_tiers else {})}, N)


def machine_of(network):
    return Machine.from_dict({"name": "toy", "gpus_per_node": N, "device_memory_gib": 16, "gemm_tflops": 1.0,
                              "spmm": {"kind": "paper", "c0": 1e-3, "c1": 0.0, "c2": 0.0},
                              "collectives": json.loads(json.dumps(network.to_dict()))})


# ----------------------------------------------------------------------------- bus bandwidth


def test_bus_bandwidth_factors_are_nccl_tests():
    # nccl-tests: broadcast busbw = algbw; alltoall (our point_to_point) busbw = algbw (g-1)/g
    ops = np.array(["broadcast", "point_to_point", "all_reduce", "all_gather"])
    algbw, busbw = bus_bandwidth_gbps(ops, np.array([4, 4, 4, 4]), 2e9, 1000.0)  # 2 GB in 1 s
    np.testing.assert_allclose(algbw, [2.0, 2.0, 2.0, 2.0])
    np.testing.assert_allclose(busbw, [2.0, 1.5, 3.0, 1.5])
    steps, _ = ring_terms(ops, np.array([8, 8, 8, 8]))
    np.testing.assert_allclose(steps, [7, 7, 14, 7])
    with pytest.raises(UserError, match="unknown collective op 'gather'"):
        ring_terms("gather", 2)


def test_calibration_records_carry_the_convention():
    # one broadcast and one exchange of 8 MB on a group of 4, timed 4 ms (slowest rank per call, median)
    per_rank = [[(4, 1, "concurrent", "broadcast", 2_000_000, [0.004, 0.004, 0.003]),
                 (4, 1, "concurrent", "point_to_point", 2_000_000, [0.004, 0.005, 0.004])] for _ in range(4)]
    recs = collective_records(per_rank, world=4, gpus_per_node=4, backend="gloo")
    assert [r["op"] for r in recs] == ["broadcast", "point_to_point"]
    assert [r["message_bytes"] for r in recs] == [8_000_000, 8_000_000]
    assert [r["time_ms"] for r in recs] == pytest.approx([4.0, 4.0])
    assert [r["algbw_gbps"] for r in recs] == pytest.approx([2.0, 2.0])
    assert [r["busbw_gbps"] for r in recs] == pytest.approx([2.0, 1.5])


# ----------------------------------------------------------------------------- terms by hand


def test_exchange_terms_by_hand():
    net = toy()
    m = 8e6
    # point_to_point on all 8 ranks of 2 nodes of 4: 3 messages of M/8 inside the node, 4 across,
    # the crossing bytes shared by the 4 senders of the node
    p = OWN["point_to_point"]
    want = ms(3 * p["alpha_intra_us"]) + ms(4 * p["alpha_inter_us"]) + ms(0, 3 * m / 8, p["beta_intra_gbps"]) \
        + ms(0, 4 * m / 8 * 4, p["beta_inter_gbps"])
    assert float(net.time_ms("point_to_point", 8, 1, m)) == pytest.approx(want, rel=1e-12)
    # inside a node (g = 4): 3 messages, no crossing
    assert float(net.time_ms("point_to_point", 4, 1, m)) == pytest.approx(
        ms(3 * p["alpha_intra_us"]) + ms(0, 3 * m / 4, p["beta_intra_gbps"]), rel=1e-12)
    # broadcast: (g-1) alpha + M / beta on the group's tier; across nodes at stride 2, 2 groups share the NIC
    b = OWN["broadcast"]
    assert float(net.time_ms("broadcast", 4, 1, m)) == pytest.approx(ms(3 * b["alpha_intra_us"]) + ms(0, m, b["beta_intra_gbps"]))
    assert float(net.time_ms("broadcast", 4, 2, m)) == pytest.approx(ms(3 * b["alpha_inter_us"]) + ms(0, 2 * m, b["beta_inter_gbps"]))
    # without op_tiers both use the collectives' tiers; a broadcast then equals the all-gather of g M / (g-1)
    plain = toy(op_tiers=None)
    assert float(plain.time_ms("broadcast", 4, 2, m)) == pytest.approx(float(plain.time_ms("all_gather", 4, 2, m * 4 / 3)))
    # the terms themselves, hand-derived for the exchange across two nodes
    t = exchange_terms("point_to_point", np.array([8]), placement(8, 1, N), np.array([m]), np.array([1.0]), True)
    assert (float(t.lat_intra[0]), float(t.lat_inter[0]), float(t.bytes_intra[0]), float(t.bytes_inter[0])) == \
        pytest.approx((3, 4, 3 * m / 8, 4 * m / 8 * 4))


def test_profile_round_trip_scale_and_bad_op_tiers():
    net = toy()
    again = Network.from_dict(json.loads(json.dumps(net.to_dict())), N)
    assert again == net and again.tiers("broadcast") == OWN["broadcast"]
    assert again.tiers("all_gather") == BASE
    scaled = scale_collectives(net.to_dict(), 2.0)
    assert scaled["op_tiers"]["point_to_point"]["alpha_inter_us"] == 240.0
    assert scaled["op_tiers"]["point_to_point"]["beta_inter_gbps"] == 4.0
    assert float(Network.from_dict(scaled, N).time_ms("broadcast", 8, 1, 1e6)) == pytest.approx(
        2 * float(net.time_ms("broadcast", 8, 1, 1e6)))
    assert float(net.scaled(2.0).time_ms("point_to_point", 8, 1, 1e6)) == pytest.approx(
        2 * float(net.time_ms("point_to_point", 8, 1, 1e6)))
    with pytest.raises(UserError, match="op_tiers has 'all_gather'"):
        Network.from_dict({**BASE, "op_tiers": {"all_gather": BASE}}, N)
    with pytest.raises(UserError, match="op_tiers.broadcast.beta_inter_gbps"):
        Network.from_dict({**BASE, "op_tiers": {"broadcast": {**BASE, "beta_inter_gbps": 0}}}, N)


# ----------------------------------------------------------------------------- the fit


def synthetic(network, *, seed, noise):
    """16 ranks on nodes of 4: every axis shape of a grid of 16, every op, 64 KiB .. 16 MiB."""
    rng = np.random.default_rng(seed)
    rows = [{"op": op, "group_size": g, "stride": p, "nodes": int(placement(g, p, N).nodes), "message_bytes": m,
             "gpus_per_node": N}
            for g, p in collective_shapes(16) for op in ALL_OPS for m in SIZES]
    df = pd.DataFrame(rows)
    exact = network.time_ms(df["op"].to_numpy(), df["group_size"], df["stride"], df["message_bytes"])
    df["time_ms"] = exact * (1.0 + noise * rng.standard_normal(len(df)))
    return df


@pytest.mark.parametrize("sharing", [True, False])
def test_noiseless_exchange_timings_give_back_their_tiers(sharing):
    truth = toy(sharing=sharing)
    df = synthetic(truth, seed=0, noise=0.0)
    model = fit_collectives(df, n_splits=0, form="two-tier", sharing=sharing)
    for op, tiers in OWN.items():
        for key, value in tiers.items():
            assert model.network.tiers(op)[key] == pytest.approx(value, rel=1e-6), (op, key)
        assert model.op_fit[op]["intra"] > 0 and model.op_fit[op]["inter"] > 0
    for key, value in BASE.items():  # the collectives' tiers are fitted on the collectives alone
        assert getattr(model.network, key) == pytest.approx(value, rel=1e-6), key
    np.testing.assert_allclose(model.predict(df), df["time_ms"], rtol=1e-6)
    # the profile the fit writes times the ops as the fit does
    fitted = machine_of(model.network).network
    np.testing.assert_allclose(fitted.time_ms(df["op"].to_numpy(), df["group_size"], df["stride"], df["message_bytes"]),
                               df["time_ms"], rtol=1e-6)


def test_noisy_exchange_timings_recover_their_tiers_within_five_percent():
    df = synthetic(toy(), seed=4, noise=0.03)
    model = fit_collectives(df, n_splits=0)
    for op, tiers in OWN.items():
        for key, value in tiers.items():
            assert model.network.tiers(op)[key] == pytest.approx(value, rel=0.05), (op, key)
        assert model.op_fit[op]["mape"] < 5
    # every candidate network carries them, so a choice made on trainer runs keeps them
    assert all(dict(c.op_tiers).keys() == OWN.keys() for c in model.candidates.values())


def test_exchange_only_timings_are_refused():
    df = synthetic(toy(), seed=0, noise=0.0)
    with pytest.raises(UserError, match="all-reduce, all-gather or reduce-scatter"):
        fit_collectives(df[df["op"].isin(["broadcast", "point_to_point"])], n_splits=0)


# ----------------------------------------------------------------------------- the families use them


def test_partitioned_exchange_uses_the_point_to_point_tiers():
    machine = machine_of(toy())
    rows, w = 500.0, 256.0  # rows per ordered pair, bytes per row: M = 8 ranks x 500 rows x 256 bytes
    stats = exchange_stats(UniformExchange(8, rows), N, True)
    got = point_to_point_ms(machine, stats, w)
    assert got == pytest.approx(float(machine.network.time_ms("point_to_point", 8, 1, 8 * rows * w)), rel=1e-12)
    p = OWN["point_to_point"]
    assert got == pytest.approx(ms(3 * p["alpha_intra_us"]) + ms(4 * p["alpha_inter_us"])
                                + ms(0, 3 * rows * w, p["beta_intra_gbps"]) + ms(0, 4 * rows * w * 4, p["beta_inter_gbps"]))
    # a rank sending more than the others sets the time (SuperGCN's bottleneck): its last row
    # crosses when the node's whole inter-node volume has, 4 + 4 + 4 + 6 = 18 pair-rows against
    # the uniform 16, i.e. 2 rows more at the link's rate (fair sharing, not 4 x its own 6)
    pair = np.full((8, 8), rows)
    pair[0, 5] = 3 * rows
    assert point_to_point_ms(machine, exchange_stats(pair, N, True), w) == pytest.approx(
        got + ms(0, 2 * rows * w, p["beta_inter_gbps"]))


def test_exchange_shares_the_node_link_fairly_among_unequal_senders():
    """Node 0's ranks send 1, 2, 3 and 4 rows to rank 4 (node 1; nodes of 4), nothing else moves.
    Under fair sharing the 1-row sender is through after 4 rows have crossed, the 2-row one
    after 1 + 2 + 2 + 2 = 7, the 3-row one after 9, the 4-row one after the node's 10:
    shares 4, 3.5, 3 and 2.5. Without sharing each sends alone."""
    pair = np.zeros((8, 8))
    pair[:4, 4] = [1.0, 2.0, 3.0, 4.0]
    stats = exchange_stats(pair, N, True)
    assert stats["share"][:4].tolist() == pytest.approx([4.0, 3.5, 3.0, 2.5])
    assert (stats["inter_rows"] * stats["share"])[:4].tolist() == pytest.approx([4.0, 7.0, 9.0, 10.0])
    assert exchange_stats(pair, N, False)["share"].tolist() == [1.0] * 8
    machine = machine_of(toy())
    p = OWN["point_to_point"]
    w = 1e5
    assert point_to_point_ms(machine, stats, w) == pytest.approx(ms(p["alpha_inter_us"]) + ms(0, 10 * w, p["beta_inter_gbps"]))


def test_family_broadcasts_use_the_broadcast_tiers():
    machine = machine_of(toy())
    call = CommCall(name="h", op="broadcast", comm_class="aggregation", direction="forward", axis=0, group_size=8,
                    stride=1, message_bytes=1e6, rows=1000, calls=3, sent_bytes=np.zeros(8))
    out = schedule_times(machine, [call], parse_comm_precision("fp32"), 4)
    b = OWN["broadcast"]
    assert out["broadcast_ms"] == pytest.approx(3 * (ms(7 * b["alpha_inter_us"]) + ms(0, 1e6, b["beta_inter_gbps"])))
    assert out["comm_ms"] == pytest.approx(out["broadcast_ms"])


def test_flat_broadcast_by_hand_and_the_fit_picks_the_form_that_made_the_timings():
    b = {**OWN["broadcast"], "form": "flat"}
    net = toy({**OWN, "broadcast": b})
    m = 4e6
    # the root sends M to each of its 3 node mates and the 4 members on the other node
    assert float(net.time_ms("broadcast", 8, 1, m)) == pytest.approx(
        ms(3 * b["alpha_intra_us"]) + ms(4 * b["alpha_inter_us"]) + ms(0, 3 * m, b["beta_intra_gbps"])
        + ms(0, 4 * m, b["beta_inter_gbps"]))
    # stride 2 on nodes of 4: 2 groups share the node's link
    assert float(net.time_ms("broadcast", 4, 2, m)) == pytest.approx(
        ms(1 * b["alpha_intra_us"]) + ms(2 * b["alpha_inter_us"]) + ms(0, m, b["beta_intra_gbps"])
        + ms(0, 2 * m * 2, b["beta_inter_gbps"]))
    assert Network.from_dict(json.loads(json.dumps(net.to_dict())), N) == net
    # flat-overlapped: the same sends posted at once, one latency per tier
    o = {**OWN["broadcast"], "form": "flat-overlapped"}
    overlapped = toy({**OWN, "broadcast": o})
    assert float(overlapped.time_ms("broadcast", 8, 1, m)) == pytest.approx(
        ms(o["alpha_intra_us"]) + ms(o["alpha_inter_us"]) + ms(0, 3 * m, o["beta_intra_gbps"])
        + ms(0, 4 * m, o["beta_inter_gbps"]))
    assert float(overlapped.time_ms("broadcast", 2, 1, m)) == pytest.approx(
        ms(o["alpha_intra_us"]) + ms(0, m, o["beta_intra_gbps"]))  # two ranks: the same as flat
    for truth, form in ((net, "flat"), (toy(), "ring"), (overlapped, "flat-overlapped")):
        model = fit_collectives(synthetic(truth, seed=2, noise=0.02), n_splits=0, form="two-tier")
        assert model.op_fit["broadcast"]["form"] == form
        assert model.network.tiers("broadcast")["form"] == form
        assert model.network.tiers("broadcast")["beta_inter_gbps"] == pytest.approx(
            truth.tiers("broadcast")["beta_inter_gbps"], rel=0.05)
    with pytest.raises(UserError, match="form must be one of ring, flat"):
        Network.from_dict({**BASE, "op_tiers": {"point_to_point": {**BASE, "form": "flat"}}}, N)


@pytest.mark.parametrize("name", ["emulated-2x4-fitted", "emulated-4x2-fitted"])
def test_emulated_profiles_carry_measured_exchange_tiers_near_the_links_tc_rate(name):
    from pathlib import Path

    from plexus_tune.cluster.spec import parse_cluster
    from plexus_tune.model.machine import load_machine

    path = Path(__file__).resolve().parents[1] / "models" / f"{name}.json"
    data = json.loads(path.read_text())
    machine = load_machine(path)
    spec = parse_cluster(data["description"].split()[2])  # "emulated cluster emulated:nodes=...,inter_gbps=..."
    assert set(dict(machine.network.op_tiers)) == {"broadcast", "point_to_point"}
    assert "op_tiers.broadcast" in data["provenance"]["collectives"]
    assert "op_tiers.point_to_point" in data["provenance"]["collectives"]
    # the calibration's concurrent exchanges and broadcasts load every rank of a node at once: a form
    # with NIC sharing fits the link's rate, one without it the rate of one of the node's flows
    flows = 1 if machine.network.sharing else spec.ranks_per_node
    for op, fitted in data["fit"]["collectives"]["op_tiers"].items():
        # measured on the tbf-shaped node links: the fitted inter-node bandwidth is the link's rate
        # within a factor of 1.5 (noise of a shared 2-core host), the unshaped intra-node one above it
        assert spec.inter_gbps / 1.5 < flows * fitted["beta_inter_gbps"] < 1.5 * spec.inter_gbps, (op, flows)
        assert fitted["beta_intra_gbps"] > 2 * spec.inter_gbps, op
        assert fitted["rows"] >= 2 * 7  # at least two shapes at every one of the 7 message sizes
