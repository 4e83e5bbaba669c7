import json
import multiprocessing as mp
import warnings

import numpy as np
import pytest

from plexus_tune.errors import UserError
from plexus_tune.measure.store import (
    RUN_SCHEMA,
    SPMM_SCHEMA,
    append_records,
    failure_record,
    flatten_record,
    read_records,
    records_frame,
)


def _writer(path, writer_id, count, start_event):
    start_event.wait()
    for i in range(count):
        # payloads of varying length, long enough that interleaved writes would break lines
        append_records(path, [{"writer": writer_id, "i": i, "pad": "x" * (200 + 37 * (i % 11))}])


def test_two_processes_appending_500_each_leave_1000_intact_records(tmp_path):
    path = tmp_path / "runs.jsonl"
    ctx = mp.get_context("fork")
    start = ctx.Event()
    procs = [ctx.Process(target=_writer, args=(str(path), w, 500, start)) for w in (0, 1)]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    records, problems = read_records(path)
    assert problems == []
    assert len(records) == 1000
    for w in (0, 1):
        mine = [r["i"] for r in records if r["writer"] == w]
        assert mine == list(range(500))  # each writer's own order is kept
    assert all(r["schema"] == RUN_SCHEMA for r in records)
    assert all(len(r["pad"]) == 200 + 37 * (r["i"] % 11) for r in records)
    # every line is one complete JSON object
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b"" and len(lines) == 1001


def test_truncated_last_line_and_garbage_middle_line_keep_every_good_record(tmp_path):
    path = tmp_path / "log.jsonl"
    append_records(path, [{"k": i} for i in range(3)])
    with open(path, "ab") as fh:
        fh.write(b"this is not json\n")
    append_records(path, [{"k": i} for i in range(3, 6)])
    with open(path, "ab") as fh:
        fh.write(b'{"schema": "plexus-tune/run-v1", "k": 6, "epo')  # a writer died here
    records, problems = read_records(path)
    assert [r["k"] for r in records] == [0, 1, 2, 3, 4, 5]
    assert [p.line for p in problems] == [4, 8]
    assert "malformed JSON" in problems[0].reason
    assert "truncated" in problems[1].reason
    assert "line 8" in str(problems[1])


def test_append_after_truncated_line_starts_a_fresh_line(tmp_path):
    path = tmp_path / "log.jsonl"
    append_records(path, [{"k": 0}])
    with open(path, "ab") as fh:
        fh.write(b'{"schema": "plexus-tune/run-v1", "k": 1')
    append_records(path, [{"k": 2}, {"k": 3}])
    records, problems = read_records(path)
    assert [r["k"] for r in records] == [0, 2, 3]
    assert [p.line for p in problems] == [2]
    assert "malformed" in problems[0].reason  # no longer last: it is now a closed bad line


def test_other_problems_are_named(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text(
        "\n".join(
            [
                json.dumps({"schema": RUN_SCHEMA, "k": 0}),
                "[1, 2]",
                json.dumps({"k": 2}),
                json.dumps({"schema": "plexus-tune/run-v9", "k": 3}),
                json.dumps({"schema": "plexus-tune/banana-v1"}),
                "",
                json.dumps({"schema": RUN_SCHEMA, "k": 6}),
            ]
        )
        + "\n"
    )
    records, problems = read_records(path)
    assert [r["k"] for r in records] == [0, 6]
    reasons = {p.line: p.reason for p in problems}
    assert set(reasons) == {2, 3, 4, 5}
    assert "not an object" in reasons[2]
    assert "schema" in reasons[3]
    assert "newer" in reasons[4]
    assert "unknown record type" in reasons[5]


def test_values_are_made_plain_and_schema_is_versioned(tmp_path):
    path = tmp_path / "log.jsonl"
    n = append_records(
        path,
        [{"nnz": np.int64(7), "t": np.float32(1.5), "v": np.arange(3), "bad": float("nan")}],
        schema=SPMM_SCHEMA,
    )
    assert n == 1
    (rec,), problems = read_records(path)
    assert problems == []
    assert rec == {"schema": SPMM_SCHEMA, "nnz": 7, "t": 1.5, "v": [0, 1, 2], "bad": None}
    with pytest.raises(UserError, match="schema"):
        append_records(path, [{"a": 1}], schema=None)
    with pytest.raises(UserError, match="not of the form"):
        append_records(path, [{"schema": "runs", "a": 1}])
    with pytest.raises(UserError, match="does not exist"):
        read_records(tmp_path / "missing.jsonl")


def test_frame_flattens_and_keeps_failed_runs(tmp_path):
    path = tmp_path / "runs.jsonl"
    ok = {"grid": {"gx": 2, "gy": 1, "gz": 2}, "status": "ok", "epoch_ms": 12.5}
    bad = failure_record({"grid": {"gx": 4, "gy": 1, "gz": 1}}, "CUDA out of memory", status="oom")
    append_records(path, [ok, bad])
    append_records(path, [{"nnz": 3, "time_ms": 0.1}], schema=SPMM_SCHEMA)
    with open(path, "ab") as fh:
        fh.write(b"garbage\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        df = records_frame(path, schema="run")
    assert any("line 4" in str(w.message) for w in caught)
    assert list(df["grid.gx"]) == [2, 4]
    assert list(df["status"]) == ["ok", "oom"]
    assert df["reason"].iloc[1] == "CUDA out of memory"
    assert np.isnan(df["epoch_ms"].iloc[1])
    everything = records_frame(path, warn=False)
    assert len(everything) == 3
    assert flatten_record({"a": {"b": {"c": 1}}, "d": [1]}) == {"a.b.c": 1, "d": [1]}
    frame = records_frame([{"schema": RUN_SCHEMA, "x": {"y": 1}}])
    assert list(frame.columns) == ["schema", "x.y"]
    with pytest.raises(UserError, match="status"):
        failure_record({}, "why", status="weird")


def test_read_runs_reads_several_logs_of_both_versions_and_names_bad_lines(tmp_path):
    from plexus_tune.measure.store import read_runs

    old, new = tmp_path / "old.jsonl", tmp_path / "new.jsonl"
    old.write_text(json.dumps({"schema": "plexus-tune/run-v1", "nodes": 5, "k": 0}) + "\n{broken\n")
    append_records(new, [{"graph_nodes": 6, "k": 1}])
    append_records(new, [{"nnz": 1, "time_ms": 0.5}], schema=SPMM_SCHEMA)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runs = read_runs([old, new])
    assert [r["k"] for r in runs] == [0, 1]  # run records only, as stored
    assert runs[0]["nodes"] == 5 and runs[0]["schema"].endswith("-v1")
    assert len(caught) == 1 and "old.jsonl: skipped 1 bad line(s): line 2" in str(caught[0].message)
    assert RUN_SCHEMA == "plexus-tune/run-v2" and SPMM_SCHEMA == "plexus-tune/spmm-v2"
