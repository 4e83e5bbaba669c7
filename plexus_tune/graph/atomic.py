"""Write-then-rename helpers: an output either appears complete or not at all."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from pathlib import Path

from plexus_tune.errors import UserError
from plexus_tune.paths import check_creatable, check_not_input, make_parent


def _umask() -> int:
    """The process's umask (read by setting it and putting it back)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def check_output_path(path, overwrite: bool, *, inputs=()) -> Path:
    """A file or directory to write whole at ``path`` (the output rule of :mod:`plexus_tune.paths`):
    never one of ``inputs``; an existing one replaced only with ``overwrite``; its parent an
    existing writable directory."""
    path = Path(path)
    check_not_input(path, inputs)
    if path.exists() and not overwrite:
        raise UserError(f"{path} already exists; remove it or allow overwriting", parameter="force")
    if path.exists() and not path.is_dir() and not stat.S_ISREG(path.stat().st_mode):
        raise UserError(f"{path} is not a regular file (a pipe or device); give another path")
    if not path.exists():
        check_creatable(path)  # a missing directory is created when the output is written
    return path


@contextlib.contextmanager
def atomic_file(path, *, overwrite: bool = False):
    """Yield a temporary path in the target's directory (same suffix); on success it is
    given the permissions the umask gives new files and renamed onto ``path``, on any
    error it is removed."""
    path = make_parent(check_output_path(path, overwrite))
    suffix = "".join(path.suffixes[-2:]) if path.suffix == ".gz" else path.suffix
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=f".tmp{suffix}", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        if path.is_dir():
            raise UserError(f"{path} is a directory; choose a file name")
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


@contextlib.contextmanager
def atomic_directory(path, *, overwrite: bool = False):
    """Yield a fresh temporary directory beside ``path``; on success it gets the permissions
    the umask gives new directories and replaces ``path`` (an existing one is moved aside
    first and deleted after), on error it is deleted."""
    path = make_parent(check_output_path(path, overwrite))
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp creates 0700
        old = None
        if path.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old", dir=path.parent))
            os.rename(path, old / "previous")
        os.rename(tmp, path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
