"""Append-only measurement logs (JSON Lines) of typed, versioned records.

Every line of a log is one JSON object with a ``schema`` field naming its record type
and version, ``plexus-tune/<type>-v<version>``: ``run`` (a trainer run or one trial of
it), ``spmm``, ``gemm`` (a timed kernel) and ``collective`` (a timed collective). The
schemas, their versions and the mapping of older versions are in
:mod:`plexus_tune.measure.records` (docs/records.md); this module reads and writes
lines. Failed runs are kept: they are data.

Writes are atomic with several writers at once: a batch is encoded completely in
memory, then written by one ``os.write`` on a file descriptor opened with
``O_APPEND`` while holding an exclusive ``fcntl.flock``, then fsynced. A reader never
sees half a batch from a live writer; a writer killed mid-write can leave a truncated
last line, which the next writer closes off with a newline so that the damage stays on
that one line. :func:`read_records` reports such lines (with their line numbers) and
keeps every good record.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from plexus_tune.errors import SkippedLinesWarning, UserError
from plexus_tune.paths import check_input_file, check_output_file
from plexus_tune.measure.records import (  # noqa: F401  (the schema names are part of this module's API)
    COLLECTIVE_SCHEMA,
    FAILURE_STATUSES,
    GEMM_SCHEMA,
    RUN_SCHEMA,
    SCHEMA_PREFIX,
    SCHEMA_VERSIONS,
    SPMM_SCHEMA,
    check_current_fields,
    check_schema,
    flatten_record,
    record_type,
)

try:  # POSIX only; elsewhere appends are still single-write but not locked.
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None

#: record type -> newest version this reader understands
KNOWN_SCHEMAS = SCHEMA_VERSIONS


@dataclass(frozen=True)
class BadLine:
    """A line of a log that could not be used: its 1-based number, why, and its start."""

    line: int
    reason: str
    excerpt: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.reason} ({self.excerpt!r})"


def now_utc() -> str:
    """The current time as an ISO 8601 UTC string (seconds)."""
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def _plain(value):
    """JSON-ready copy of value: numpy scalars/arrays to Python, non-finite floats to None."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, (str, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "tolist"):  # numpy arrays and scalars
        return _plain(value.tolist())
    if hasattr(value, "item"):
        return _plain(value.item())
    raise UserError(f"cannot store a value of type {type(value).__name__} in a measurement log: {value!r}")


def encode_records(records: Iterable[Mapping], *, schema: str | None = None) -> bytes:
    """Encode records as JSON Lines (each ends with a newline); fills ``schema`` if absent."""
    lines = []
    for i, record in enumerate(records):
        if not isinstance(record, Mapping):
            raise UserError(f"record {i} is a {type(record).__name__}, not a dict")
        rec = _plain(record)
        if "schema" not in rec:
            if schema is None:
                raise UserError(f"record {i} has no 'schema' field and no default schema was given")
            rec = {"schema": schema, **rec}
        check_schema(rec["schema"], where=f"record {i}")
        check_current_fields(rec, where=f"record {i}")
        lines.append(json.dumps(rec, separators=(",", ":"), allow_nan=False))
    return ("\n".join(lines) + "\n").encode("utf-8") if lines else b""


def append_records(path, records: Iterable[Mapping], *, schema: str | None = RUN_SCHEMA) -> int:
    """Append records to the JSON Lines log at path, atomically; returns how many were written.

    Records without a ``schema`` field get ``schema`` (default: a trainer run). The
    whole batch goes out in one locked ``O_APPEND`` write followed by ``fsync``, so
    concurrent writers (processes or threads) never interleave inside a batch.
    """
    records = list(records)
    payload = encode_records(records, schema=schema)
    if not payload:
        return 0
    path = Path(path)
    if path.parent and not path.parent.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as exc:
        raise UserError(f"cannot open measurement log {path} for appending: {exc.strerror}") from exc
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            size = os.fstat(fd).st_size
            if size > 0:
                # A writer killed mid-line leaves no newline at the end: close that line
                # off so the damage stays on it and our first record starts a fresh line.
                with open(path, "rb") as fh:
                    fh.seek(size - 1)
                    if fh.read(1) != b"\n":
                        payload = b"\n" + payload
            view = memoryview(payload)
            while view:  # one write in practice; loop only on a short write
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        finally:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
    return len(records)


def warn_bad_lines(path, problems) -> None:
    """Report the skipped lines of one log as one :class:`SkippedLinesWarning` (the first three named)."""
    if not problems:
        return
    shown = "; ".join(str(p) for p in problems[:3])
    more = f" and {len(problems) - 3} more" if len(problems) > 3 else ""
    warnings.warn(SkippedLinesWarning(f"{path}: skipped {len(problems)} bad line(s): {shown}{more}"), stacklevel=3)


def check_is_log(path, records, problems, *, hint: str = "give a log written by plexus-tune") -> None:
    """UserError if a file holds lines but not one record: it is not a measurement log."""
    if problems and not records:
        raise UserError(f"{path} is not a plexus-tune measurement log ({problems[0]}); {hint}")


def _first_line(path: Path, limit: int = 1 << 22) -> tuple[int, bytes]:
    """(1-based number, content) of the first non-blank line of a file (at most ``limit``
    bytes of it), or (0, b"")."""
    with open(path, "rb") as fh:
        number = 0
        while True:
            raw = fh.readline(limit)
            number += 1
            if not raw:
                return 0, b""
            if raw.strip():
                return number, raw.rstrip(b"\n")


#: what each kind of log holds (``check_log``'s ``kinds``)
RUN_LOG = ("run",)
SPMM_LOG = ("spmm", "gemm")
COLLECTIVE_LOG = ("collective",)
QUANT_LOG = ("quant",)
BANDWIDTH_LOG = ("bandwidth",)
SAMPLING_LOG = ("sampling",)


def check_log(path, *, kinds=None, inputs=()) -> Path:
    """Check, before any work, that records can be appended to the log at ``path``.

    The path must not be a directory or one of ``inputs``, must be a writable regular
    file (or creatable, :func:`plexus_tune.paths.check_output_file`), and a file that
    exists must be a measurement log: its first line a record, of one of ``kinds``
    (record types such as ``RUN_LOG``) when given. A log gets only records of its own
    kinds. Returns the path.
    """
    path = check_output_file(path, inputs=inputs)
    if path.exists():
        try:
            number, first = _first_line(path)
        except OSError as exc:
            raise UserError(f"cannot read measurement log {path}: {exc.strerror}") from None
        if first:
            records, problems = parse_lines(first + b"\n")
            if problems:
                bad = BadLine(number, problems[0].reason, problems[0].excerpt)
                raise UserError(f"{path} is not a plexus-tune measurement log ({bad}); "
                                "give a new file or a log that plexus-tune wrote")
            held = record_type(records[0])
            if kinds is not None and held not in kinds:
                raise UserError(f"{path} is a log of {held} records; this command appends {'/'.join(kinds)} records: "
                                f"give a new file or a log of {'/'.join(kinds)} records")
    return path


def parse_lines(data: bytes) -> tuple[list[dict], list[BadLine]]:
    """Parse JSON Lines bytes into (good records, bad lines); blank lines are ignored."""
    records: list[dict] = []
    problems: list[BadLine] = []
    lines = data.split(b"\n")
    ends_with_newline = data.endswith(b"\n")
    if ends_with_newline:
        lines = lines[:-1]
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        excerpt = raw[:60].decode("utf-8", errors="replace")
        last_unterminated = number == len(lines) and not ends_with_newline
        try:
            record = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            problems.append(BadLine(number, "not valid UTF-8", excerpt))
            continue
        except json.JSONDecodeError as exc:
            reason = "truncated record (no newline at end of file)" if last_unterminated else f"malformed JSON: {exc.msg} at column {exc.colno}"
            problems.append(BadLine(number, reason, excerpt))
            continue
        if not isinstance(record, dict):
            problems.append(BadLine(number, f"a JSON {type(record).__name__}, not an object", excerpt))
            continue
        if "schema" not in record:
            problems.append(BadLine(number, "no 'schema' field", excerpt))
            continue
        try:
            check_schema(record["schema"], where=f"line {number}")
        except UserError as exc:
            problems.append(BadLine(number, str(exc).split(": ", 1)[1], excerpt))
            continue
        records.append(record)
    return records, problems


def read_records(path, *, schema: str | None = None) -> tuple[list[dict], list[BadLine]]:
    """Read a log: (records, problems). Bad lines are skipped and named in problems.

    With ``schema`` (a full name such as ``RUN_SCHEMA``, or a type such as ``"spmm"``),
    only records of that type are returned.
    """
    path = Path(path)
    if path.exists():
        check_input_file(path, "measurement log")
    try:
        data = path.read_bytes()
    except FileNotFoundError as exc:
        raise UserError(f"measurement log {path} does not exist") from exc
    except OSError as exc:
        raise UserError(f"cannot read measurement log {path}: {exc.strerror}") from exc
    records, problems = parse_lines(data)
    check_is_log(path, records, problems)
    if schema is not None:
        want = record_type({"schema": schema})
        records = [r for r in records if record_type(r) == want]
    return records, problems


def read_runs(paths, *, warn: bool = True) -> list[dict]:
    """The run records of one log or several (as stored; any version), bad lines skipped with a warning."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    runs: list[dict] = []
    for path in paths:
        records, problems = read_records(path, schema="run")
        if warn:
            warn_bad_lines(path, problems)
        runs.extend(records)
    return runs


def records_frame(source, *, schema: str | None = None, warn: bool = True):
    """A pandas DataFrame of the records of a log (path), of several logs, or of dicts.

    Nested dicts are flattened with dotted column names. Bad lines of a log are skipped
    with a warning naming them (``warn=False`` to silence).
    """
    import pandas as pd

    if isinstance(source, (str, os.PathLike)):
        sources = [source]
    elif isinstance(source, Mapping):
        sources = [[source]]
    else:
        source = list(source)
        sources = source if source and all(isinstance(s, (str, os.PathLike)) for s in source) else [source]
    rows: list[dict] = []
    for src in sources:
        if isinstance(src, (str, os.PathLike)):
            records, problems = read_records(src, schema=schema)
            if warn:
                warn_bad_lines(src, problems)
        else:
            records = list(src)
            if schema is not None:
                want = record_type({"schema": schema})
                records = [r for r in records if record_type(r) == want]
        rows.extend(flatten_record(r) for r in records)
    return pd.DataFrame(rows)


def failure_record(record: Mapping, reason: str, *, status: str = "failed") -> dict:
    """A copy of record marked as failed: ``status`` (failed, oom, timeout) and ``reason``."""
    if status not in FAILURE_STATUSES:
        raise UserError(f"failure status must be one of {', '.join(FAILURE_STATUSES)}, not {status!r}")
    return {**record, "status": status, "reason": str(reason)}


def environment_info() -> dict:
    """Provenance of a measurement: host, platform, Python/torch/numpy versions, git commit."""
    import platform
    import subprocess
    import sys

    info = {
        "host": platform.node(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
    }
    for module in ("numpy", "torch", "scipy"):
        mod = sys.modules.get(module)
        if mod is None:
            try:
                mod = __import__(module)
            except ImportError:
                continue
        info[module] = getattr(mod, "__version__", "unknown")
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
        )
        if commit.returncode == 0:
            info["commit"] = commit.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return info
