import json

import numpy as np
import pytest

from plexus_tune.errors import UserError
from plexus_tune.model.machine import (
    FIELDS, Machine, collective_time_ms, effective_beta_gbps, is_intra_node, list_machines, load_machine,
)

SHIPPED = ("perlmutter-paper", "perlmutter", "frontier", "cpu-gloo-2core")


def minimal_profile(**over):
    data = {
        "name": "toy", "gpus_per_node": 4, "device_memory_gib": 16, "gemm_tflops": 1.0,
        "spmm": {"kind": "paper", "c0": 1e-3, "c1": 0.0, "c2": 0.0},
        "collectives": {"alpha_intra_us": 10, "beta_intra_gbps": 100, "alpha_inter_us": 20, "beta_inter_gbps": 40},
    }
    data.update(over)
    return data


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_profiles_load_and_document_every_number(name):
    m = load_machine(name)
    assert m.name == name
    prov = m.raw.get("provenance", {})
    numeric = [k for k, v in m.raw.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    numeric += ["spmm"] + [f"collectives.{k}" for k in m.raw["collectives"]]
    for key in numeric:
        assert key in prov, f"{name}: no provenance for {key}"
    for key in list(m.raw) + [f"collectives.{k}" for k in m.raw["collectives"]]:
        assert key in FIELDS, f"{name}: undocumented field {key}"


def test_perlmutter_paper_is_the_paper_model():
    m = load_machine("perlmutter-paper")
    assert m.gpus_per_node == 4
    assert m.spmm == {"kind": "paper", "c0": 7.8e-4, "c1": 7.8e-10, "c2": -2.6e-10}
    assert m.collectives["alpha_intra_us"] == 0 and m.collectives["alpha_inter_us"] == 0
    assert m.collectives["beta_intra_gbps"] == 200 and m.collectives["beta_inter_gbps"] == 100
    assert "bandwidth_table" not in m.collectives
    assert m.device_memory_bytes == 40 * 2**30 and m.memory_reserved_bytes == 0


def test_paper_topology_tiers():
    m = load_machine("perlmutter-paper")
    # Y (stride 1) group of 4 fits a node; X at stride 2 with 2 ranks too (2*2 <= 4)
    assert effective_beta_gbps(m, "all_reduce", 4, 1) == 200
    assert effective_beta_gbps(m, "all_reduce", 2, 2) == 200
    # crossing nodes: 100 / min(4, stride)
    assert effective_beta_gbps(m, "all_reduce", 8, 1) == 100
    assert effective_beta_gbps(m, "all_reduce", 4, 2) == 50
    assert effective_beta_gbps(m, "all_gather", 2, 16) == 25
    assert list(is_intra_node(m, [4, 8, 2], [1, 1, 2])) == [True, False, True]


def test_measured_tables():
    p = load_machine("perlmutter")
    cases = [(1, 2, 76), (1, 4, 225), (1, 8, 66.59), (1, 64, 66.59), (2, 2, 76), (2, 4, 66.59 / 2),
             (2, 32, 66.59 / 2), (4, 2, 66.59 / 4), (16, 4, 66.59 / 4)]
    strides = [c[0] for c in cases]
    groups = [c[1] for c in cases]
    got = effective_beta_gbps(p, "all_reduce", groups, strides)
    assert np.allclose(got, [c[2] for c in cases])
    f = load_machine("frontier")
    cases = [(1, 2, 129), (1, 4, 52), (1, 8, 135), (1, 16, 40), (2, 2, 50), (2, 4, 72), (2, 8, 20),
             (4, 2, 36), (4, 8, 10), (8, 2, 5), (64, 4, 5)]
    got = effective_beta_gbps(f, "reduce_scatter", [c[1] for c in cases], [c[0] for c in cases])
    assert np.allclose(got, [c[2] for c in cases])


def test_table_first_match_ops_and_fallback():
    data = minimal_profile()
    data["collectives"]["bandwidth_table"] = [
        {"stride": 1, "group": [2, 4], "beta_gbps": 7, "ops": ["all_gather"]},
        {"stride": [1, 2], "group": [2, None], "beta_gbps": 3},
        {"stride": 1, "group": 2, "beta_gbps": 999},
    ]
    m = Machine.from_dict(data)
    assert effective_beta_gbps(m, "all_gather", 2, 1) == 7
    assert effective_beta_gbps(m, "all_reduce", 2, 1) == 3  # first entry is for all_gather only
    assert effective_beta_gbps(m, "all_reduce", 2, 4) == 40 / 4  # no entry: inter formula


def test_profile_chooses_the_collective_form():
    m = Machine.from_dict(minimal_profile())
    assert m.network.form == "two-tier" and m.network.sharing and m.collectives["form"] == "two-tier"
    data = minimal_profile()
    data["collectives"].update(form="hierarchical", sharing=False)
    h = Machine.from_dict(data)
    assert h.network.form == "hierarchical" and not h.network.sharing
    # 8 ranks over 2 nodes of 4: 2 x 3 intra steps, 2 x 1 inter step, 1.5 M at 100 GB/s, 1.0 M at 40 GB/s
    M = 1e6
    assert collective_time_ms(h, "all_reduce", 8, 1, M) == pytest.approx(6 * 10e-3 + 2 * 20e-3 + 1.5 * M / 100e9 * 1e3 + M / 40e9 * 1e3)
    data["collectives"]["form"] = "ring"
    with pytest.raises(UserError, match="collectives.form"):
        Machine.from_dict(data)


def test_collective_formulas_by_hand():
    m = Machine.from_dict(minimal_profile())
    M = 1e6
    # intra all-reduce, g=4, stride 1: 2*3 steps of 10 us + 2*3/4 * M / 100 GB/s
    assert collective_time_ms(m, "all_reduce", 4, 1, M) == pytest.approx(6 * 10e-3 + 1.5 * M / 100e9 * 1e3)
    # inter all-gather, g=2, stride 4: 1 step of 20 us + 1/2 * M / (40/4 GB/s)
    assert collective_time_ms(m, "all_gather", 2, 4, M) == pytest.approx(20e-3 + 0.5 * M / 10e9 * 1e3)
    # inter reduce-scatter, g=3, stride 2 (6 > 4): 2 steps of 20 us + 2/3 M / (40/2)
    assert collective_time_ms(m, "reduce_scatter", 3, 2, M) == pytest.approx(2 * 20e-3 + (2 / 3) * M / 20e9 * 1e3)
    # blocked: latency per message, bandwidth once
    assert collective_time_ms(m, "all_reduce", 2, 1, M, messages=5) == pytest.approx(5 * 2 * 10e-3 + M / 100e9 * 1e3)
    # a group of one costs nothing
    assert collective_time_ms(m, "all_reduce", 1, 1, M) == 0
    with pytest.raises(UserError):
        collective_time_ms(m, "gather", 2, 1, M)


def write(tmp_path, text, name="m.json"):
    path = tmp_path / name
    path.write_text(text)
    return path


def one_line_error(fn):
    with pytest.raises(UserError) as exc:
        fn()
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_bad_profiles(tmp_path):
    assert "not valid JSON" in one_line_error(lambda: load_machine(write(tmp_path, "{nope")))
    data = minimal_profile()
    del data["gemm_tflops"]
    assert "gemm_tflops" in one_line_error(lambda: load_machine(write(tmp_path, json.dumps(data))))
    data = minimal_profile()
    del data["collectives"]["beta_inter_gbps"]
    assert "collectives.beta_inter_gbps" in one_line_error(lambda: load_machine(write(tmp_path, json.dumps(data))))
    data = minimal_profile()
    data["collectives"]["alpha_intra_us"] = -1
    assert "negative" in one_line_error(lambda: load_machine(write(tmp_path, json.dumps(data))))
    data = minimal_profile(device_memory_gib=-2)
    assert "positive" in one_line_error(lambda: load_machine(write(tmp_path, json.dumps(data))))
    data = minimal_profile(spmm={"kind": "magic"})
    assert "magic" in one_line_error(lambda: load_machine(write(tmp_path, json.dumps(data))))
    data = minimal_profile()
    data["collectives"]["bandwidth_table"] = [{"stride": [4, 2], "group": 2, "beta_gbps": 1}]
    assert "bandwidth_table" in one_line_error(lambda: load_machine(write(tmp_path, json.dumps(data))))
    assert "does not exist" in one_line_error(lambda: load_machine(tmp_path / "missing.json"))
    assert "perlmutter-paper" in one_line_error(lambda: load_machine("no-such-machine"))


def test_search_path_from_environment(tmp_path, monkeypatch):
    write(tmp_path, json.dumps(minimal_profile(name="my-cluster")), "my-cluster.json")
    write(tmp_path, "[broken", "broken.json")
    monkeypatch.setenv("PLEXUS_TUNE_MODELS", str(tmp_path))
    assert load_machine("my-cluster").name == "my-cluster"
    entries = {e["name"]: e for e in list_machines()}
    assert entries["my-cluster"]["problem"] is None
    assert "not valid JSON" in entries["broken"]["problem"]
    assert set(SHIPPED) <= set(entries)
