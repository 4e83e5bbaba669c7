"""Measurement tables for fitting: loading CSV or JSON Lines logs, checking columns and values."""

from __future__ import annotations
from pathlib import Path
import numpy as np
from plexus_tune.errors import UserError
from plexus_tune.measure.records import table_row
from plexus_tune.measure.table import MAX_TIME_MS
from plexus_tune.measure.store import check_is_log, parse_lines, record_type, warn_bad_lines
from plexus_tune.model.collectives import COLLECTIVE_OPS  # noqa: F401


SPMM_COLUMNS = ("nnz", "rows", "common", "dense_cols", "time_ms")
COLLECTIVE_COLUMNS = ("op", "group_size", "nodes", "message_bytes", "time_ms")
GEMM_COLUMNS = ("rows", "inner", "cols", "time_ms")
#: the largest value a measurement column may hold (ms, bytes or a count): as a run's times
#: (:data:`plexus_tune.measure.table.MAX_TIME_MS`), and fits stay finite in float64 (squares of 1e30)
MAX_MEASURED = MAX_TIME_MS
# --------------------------------------------------------------------------- input checks


def _where(df, pos: int) -> str:
    lines = df.attrs.get("line_numbers")
    source = df.attrs.get("source")
    if lines is not None and source:
        return f"{source} line {lines[pos]}"
    return f"row {pos + 1}"


def check_frame(df, columns, *, positive=("time_ms",), numeric=None, min_count: int = 1, what: str = "measurements"):
    """Check a measurement table; UserError naming the column or row at fault.

    Every column in ``columns`` must exist; numeric columns must hold finite numbers in
    [0, :data:`MAX_MEASURED`]; columns in ``positive`` must be > 0; at least ``min_count`` rows.
    """
    import pandas as pd

    if not isinstance(df, pd.DataFrame):
        raise UserError(f"{what} must be a table (pandas DataFrame), not {type(df).__name__}")
    source = df.attrs.get("source", what)
    missing = [c for c in columns if c not in df.columns]
    if missing:
        have = ", ".join(map(str, df.columns)) or "none"
        raise UserError(f"{source}: missing column {missing[0]!r} (needs {', '.join(columns)}; has {have})")
    numeric = [c for c in columns if c != "op"] if numeric is None else numeric
    for col in numeric:
        values = pd.to_numeric(df[col], errors="coerce").to_numpy(dtype=np.float64)
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            raw = df[col].iloc[bad[0]]
            raise UserError(f"{_where(df, int(bad[0]))}: column {col!r} is {raw!r}, not a finite number")
        bad = np.flatnonzero((values <= 0) if col in positive else (values < 0))
        if bad.size:
            raise UserError(f"{_where(df, int(bad[0]))}: {col} = {values[bad[0]]:g} must be "
                            f"{'> 0' if col in positive else '>= 0'}")
        bad = np.flatnonzero(values > MAX_MEASURED)
        if bad.size:
            raise UserError(f"{_where(df, int(bad[0]))}: {col} = {values[bad[0]]:g} is beyond any measurement "
                            f"(at most {MAX_MEASURED:g}); remove the line")
    if len(df) < min_count:
        raise UserError(f"{source}: {len(df)} rows of {what}, at least {min_count} needed")


def load_table(path, *, schema: str | None = None):
    """A measurement table from a CSV file or a JSON Lines log (plexus_tune.measure.store).

    The frame's ``attrs`` remember the file and each row's line number so that errors
    can name the line.
    """
    import pandas as pd

    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise UserError(f"{path} does not exist") from None
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror}") from None
    if path.suffix.lower() == ".csv":
        import io

        try:
            df = pd.read_csv(io.BytesIO(data))
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
            raise UserError(f"{path}: not a readable CSV file ({str(exc).splitlines()[0]})") from None
        line_numbers = list(range(2, len(df) + 2))
    else:
        records, problems = parse_lines(data)
        check_is_log(path, records, problems, hint="make one with plexus-tune calibrate (or measure, for runs), "
                     "or give a CSV file")
        warn_bad_lines(path, problems)
        lines = _record_line_numbers(data)
        kept = []

        want = record_type({"schema": schema}) if schema else None
        good_lines = [n for n in lines if n not in {p.line for p in problems}]
        for number, rec in zip(good_lines, records):
            if want is None or record_type(rec) == want:
                kept.append((number, rec))
        df = pd.DataFrame([table_row(r) for _, r in kept])  # any version, in current field names
        line_numbers = [n for n, _ in kept]
    df.attrs["source"] = str(path)
    df.attrs["line_numbers"] = line_numbers
    return df


def _record_line_numbers(data: bytes) -> list[int]:
    lines = data.split(b"\n")
    if data.endswith(b"\n"):
        lines = lines[:-1]
    return [i for i, raw in enumerate(lines, start=1) if raw.strip()]

def pd_numeric(column, fill: float) -> np.ndarray:
    """A column as float64 with missing or non-numeric entries replaced by ``fill``."""
    import pandas as pd

    values = pd.to_numeric(column, errors="coerce").to_numpy(dtype=np.float64)
    return np.where(np.isfinite(values), values, fill)

