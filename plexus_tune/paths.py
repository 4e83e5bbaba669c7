"""Where plexus-tune keeps its data by default, and output paths checked before any work.

Default data directory (run logs, search studies): ``$PLEXUS_TUNE_DATA`` if set, else
``$XDG_DATA_HOME/plexus-tune``, else ``~/.local/share/plexus-tune``. It is created
when something is first written there.

The checks raise :class:`~plexus_tune.errors.UserError` without naming a command-line
flag (the command line adds it): a path that is a directory where a file is wanted, a
file where a directory is wanted, a file in the way of a directory to create, or a
place the user cannot write.
"""

from __future__ import annotations

import os
from pathlib import Path

from plexus_tune.errors import UserError

DATA_ENV = "PLEXUS_TUNE_DATA"


def data_dir() -> Path:
    """The per-user data directory (see the module docstring); not created here."""
    explicit = os.environ.get(DATA_ENV)
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "plexus-tune"
    return Path.home() / ".local" / "share" / "plexus-tune"


def default_run_log() -> Path:
    """The run log of ``run`` and measured ``search`` when none is given."""
    return data_dir() / "runs.jsonl"


def default_studies_path() -> Path:
    """The SQLite file of search studies when no storage is given."""
    return data_dir() / "studies.db"


def _check_creatable(path: Path) -> None:
    """``path`` does not exist: its nearest existing ancestor must be a writable directory."""
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise UserError(f"cannot create {path}: {ancestor} is a file, not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise UserError(f"cannot create {path}: directory {ancestor} is not writable")


def check_output_file(path, *, overwrite: bool = True) -> Path:
    """Check that a file can be written (or appended to) at ``path``; returns it as a Path."""
    if path is None or str(path) == "":
        raise UserError("the output path is empty; give a file name")
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{path} is a directory; give a file name")
    if path.exists():
        if not overwrite:
            raise UserError(f"{path} already exists; remove it or choose another name")
        if not os.access(path, os.W_OK):
            raise UserError(f"{path} is not writable")
        return path
    _check_creatable(path)
    return path


def check_output_dir(path) -> Path:
    """Check that files can be written into the directory ``path`` (created later if missing)."""
    if path is None or str(path) == "":
        raise UserError("the output directory is empty; give a directory")
    path = Path(path)
    if path.exists():
        if not path.is_dir():
            raise UserError(f"{path} is a file; give a directory")
        if not os.access(path, os.W_OK | os.X_OK):
            raise UserError(f"directory {path} is not writable")
        return path
    _check_creatable(path)
    return path
