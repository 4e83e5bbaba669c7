"""Reading a JSON file the project needs, checked against its schema (docs/cli.md, "Inputs").

:func:`read_json` is the one way a metadata file (a graph's ``metadata.json``, a shard
directory's ``manifest.json``) is read: the text is parsed, then checked with
`jsonschema` against the file's schema, and the first violation is one
:class:`~plexus_tune.errors.UserError` naming the file and the field (``arrays.indptr.shape``),
what was found and what is expected. Checks across fields that a schema cannot state
(a node count against the blocks) follow in the reader, with the same wording.
"""

from __future__ import annotations

import json
from pathlib import Path

from plexus_tune.errors import UserError

#: the largest metadata file read (a manifest of 256 x 256 blocks is about 20 MiB)
MAX_BYTES = 256 << 20

COUNT = {"type": "integer", "minimum": 0}
POSITIVE = {"type": "integer", "minimum": 1}


def field_name(path) -> str:
    """``a.b[2].c`` for a jsonschema path ``deque(['a', 'b', 2, 'c'])``; ``(top level)`` when empty."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


def _kind(value) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return f"the number {value!r}"
    return {dict: "an object", list: "a list", str: f"the string {value!r}", type(None): "null"}.get(
        type(value), type(value).__name__)


def check_schema(data, schema: dict, where: str, fix: str) -> None:
    """UserError naming ``where`` and the field of the first violation of ``schema``; ``fix`` says what to do."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(schema)
    error = min(validator.iter_errors(data), key=lambda e: (len(e.absolute_path), str(e.absolute_path)), default=None)
    if error is None:
        return
    field = field_name(error.absolute_path)
    if error.validator == "required":
        missing = error.message.split("'")[1] if "'" in error.message else error.message
        raise UserError(f"{where}: {field if error.absolute_path else 'the top level'} lacks the field "
                        f"{missing!r}; {fix}")
    if error.validator == "type":
        expected = error.validator_value if isinstance(error.validator_value, str) else " or ".join(error.validator_value)
        raise UserError(f"{where}: field {field} is {_kind(error.instance)}, {expected} expected; {fix}")
    raise UserError(f"{where}: field {field}: {error.message}; {fix}")


def read_json(path, schema: dict, *, fix: str):
    """The checked content of the JSON file ``path`` (UserError if unreadable, not JSON, or against ``schema``)."""
    path = Path(path)
    try:
        if path.stat().st_size > MAX_BYTES:
            raise UserError(f"{path}: {path.stat().st_size:,} bytes, more than a metadata file holds; {fix}")
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{path} does not exist; {fix}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read {path} ({exc.__class__.__name__}); {fix}") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{path} is corrupt: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); {fix}") from None
    check_schema(data, schema, str(path), fix)
    return data
