"""Where plexus-tune keeps its data by default, and output paths checked before any work.

Default data directory (run logs, search studies): ``$PLEXUS_TUNE_DATA`` if set, else
``$XDG_DATA_HOME/plexus-tune``, else ``~/.local/share/plexus-tune``. It is created
when something is first written there.

The checks raise :class:`~plexus_tune.errors.UserError` without naming a command-line
flag (the command line adds it). One output rule holds for every command
(:func:`check_output_file`, :func:`check_output_dir`, and for logs
:func:`plexus_tune.measure.store.check_log`): an output is never one of the command's
inputs, whatever the flags; a file that is not the command's own output kind is
replaced only when the user allows it (``--force``); a missing output directory is
created with its parents when the output is written (checked before any work: no file
in the way, a writable ancestor); pipes and devices are neither read whole
(:func:`check_input_file`) nor written.
"""

from __future__ import annotations

import os
from pathlib import Path

from plexus_tune.errors import UserError

DATA_ENV = "PLEXUS_TUNE_DATA"


def data_dir() -> Path:
    """The per-user data directory (see the module docstring); not created here. UserError,
    naming the environment variable, if it or a directory above it is a file."""
    explicit = os.environ.get(DATA_ENV)
    xdg = os.environ.get("XDG_DATA_HOME")
    if explicit:
        path, source = Path(explicit).expanduser(), f"{DATA_ENV}={explicit}"
    elif xdg and os.path.isabs(xdg):
        path, source = Path(xdg) / "plexus-tune", f"XDG_DATA_HOME={xdg}"
    else:
        path, source = Path.home() / ".local" / "share" / "plexus-tune", "the default data directory"
    for place in (path, *path.parents):
        if place.exists():
            if not place.is_dir():
                raise UserError(f"{source}: {place} is a file, not a directory; point it to a directory "
                                "for run logs and search studies")
            break
    return path


def default_run_log() -> Path:
    """The run log of ``run`` and measured ``search`` when none is given."""
    return data_dir() / "runs.jsonl"


def default_studies_path() -> Path:
    """The SQLite file of search studies when no storage is given."""
    return data_dir() / "studies.db"


def check_creatable(path: Path) -> None:
    """``path`` does not exist: its nearest existing ancestor must be a writable directory.

    The one rule for a missing output directory: it is created (with its parents) when the
    output is written, as ``mkdir -p`` would, so it is checked here, before any work, that
    it can be: no file is in the way and the ancestor that exists is writable.
    """
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise UserError(f"cannot create {path}: {ancestor} is a file, not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise UserError(f"cannot create {path}: directory {ancestor} is not writable")


def make_parent(path) -> Path:
    """Create the missing directories above the output ``path`` (checked by :func:`check_creatable`); returns it as a Path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _within(path, root) -> bool:
    """Whether ``path`` is ``root`` or inside it (both resolved)."""
    path, root = os.path.realpath(path), os.path.realpath(root)
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _same_file(a, b) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def check_not_input(path, inputs=()) -> None:
    """UserError if writing ``path`` would destroy one of ``inputs``: the same file (links
    included), an input inside the directory ``path``, or ``path`` inside an input directory.

    Inputs that are not paths on disk (a synthetic spec, None) are ignored. No flag
    (force or other) lifts this check: a command never writes over what it reads.
    """
    for item in inputs or ():
        if item is None or str(item) == "" or not os.path.exists(item):
            continue
        if _same_file(path, item) or (os.path.isdir(path) and _within(item, path)) or (
                os.path.isdir(item) and _within(path, item)):
            raise UserError(f"{path} is {'' if _same_file(path, item) else 'or holds '}an input of this command "
                            f"({item}); writing there would destroy it: give another output path")


def check_input_file(path, what: str = "input", *, max_bytes: int | None = None) -> Path:
    """An input to read whole: it must exist and be a regular file (not a FIFO, device or
    directory, which would block or never end) of at most ``max_bytes``; returns it as a Path."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise UserError(f"{what} {path} does not exist") from None
    except OSError as exc:
        raise UserError(f"cannot read {what} {path}: {exc.strerror}") from None
    import stat

    if stat.S_ISDIR(mode):
        raise UserError(f"{what} {path} is a directory; give a file")
    if not stat.S_ISREG(mode):
        raise UserError(f"{what} {path} is not a regular file (a pipe or device); give a file")
    if max_bytes is not None and path.stat().st_size > max_bytes:
        raise UserError(f"{what} {path} is {path.stat().st_size / 2**20:.1f} MiB, more than the "
                        f"{max_bytes / 2**20:.0f} MiB such a file can be; is it the right file?")
    return path


def check_output_file(path, *, overwrite: bool = True, inputs=(), force: bool = False, is_own=None,
                      own_kind: str = "") -> Path:
    """Check, before any work, that a file can be written (or appended to) at ``path``; returns it as a Path.

    The one output rule of every command:

    - ``path`` is never one of ``inputs`` (:func:`check_not_input`), whatever ``force`` says;
    - an existing file is replaced only if ``overwrite``, or with ``force``; with ``is_own``
      (a test of the file's content) a file that is not the command's own output kind
      (``own_kind``) is replaced only with ``force``;
    - it is a regular file, writable; a missing parent directory must be creatable (:func:`check_creatable`).
    """
    if path is None or str(path) == "":
        raise UserError("the output path is empty; give a file name")
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{path} is a directory; give a file name")
    check_not_input(path, inputs)
    if path.exists():
        import stat

        if not stat.S_ISREG(path.stat().st_mode):
            raise UserError(f"{path} is not a regular file (a pipe or device); give a file name")
        if not overwrite and not force:
            raise UserError(f"{path} already exists; remove it, choose another name or allow replacing it",
                            parameter="force")
        if is_own is not None and not force and not is_own(path):
            raise UserError(f"{path} exists and is not {own_kind or 'an output of this command'}; choose another "
                            f"name, or allow replacing it", parameter="force")
        if not os.access(path, os.W_OK):
            raise UserError(f"{path} is not writable")
        return path
    check_creatable(path)
    return path


def check_output_dir(path, *, inputs=()) -> Path:
    """Check that files can be written into the directory ``path`` (created later with its
    parents if missing)."""
    if path is None or str(path) == "":
        raise UserError("the output directory is empty; give a directory")
    path = Path(path)
    if path.exists():
        if not path.is_dir():
            raise UserError(f"{path} is a file; give a directory")
        if not os.access(path, os.W_OK | os.X_OK):
            raise UserError(f"directory {path} is not writable")
        return path
    check_creatable(path)
    return path


def json_with_keys(path, keys, *, max_bytes: int = 1 << 26) -> bool:
    """Whether ``path`` holds a JSON object with all of ``keys`` (files over ``max_bytes``: no)."""
    import json

    try:
        if os.path.getsize(path) > max_bytes:
            return False
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(data, dict) and all(k in data for k in keys)
