"""Library errors speak of parameters, not flags; the command line names the flag."""

import ast
import pickle
import re
from pathlib import Path

import pytest

from plexus_tune.errors import UserError
from plexus_tune.measure.campaign import choose_grids
from plexus_tune.model.workload import get_dataset

PACKAGE = Path(__file__).resolve().parents[1] / "plexus_tune"
SPEC = "rmat:nodes=256,edges=1024,features=8,classes=3,seed=0"
# flags of other programs that library messages may quote (salloc's, the probe module's own)
FOREIGN_FLAGS = {"--ntasks-per-node", "--out"}


def test_library_errors_name_no_flags():
    flagged = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.parent.name == "cli":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "UserError":
                text = "".join(c.value for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, str))
                flags = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text)) - FOREIGN_FLAGS
                if flags:
                    flagged.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {sorted(flags)}")
    assert not flagged, "library errors that name flags:\n" + "\n".join(flagged)


def test_parameter_is_kept_and_survives_pickling():
    with pytest.raises(UserError) as err:
        get_dataset("no-such-graph")
    assert err.value.parameter == ("nodes", "nnz", "features", "classes") and "--" not in str(err.value)
    again = pickle.loads(pickle.dumps(err.value))
    assert str(again) == str(err.value) and again.parameter == err.value.parameter
    assert UserError("plain").parameter is None


def test_cli_adds_the_flag_of_the_command(run_cli, tmp_path):
    with pytest.raises(UserError, match="not the GPU count 4") as err:
        choose_grids(4, "2x2x2")
    assert err.value.parameter == "grids"
    code, _, stderr = run_cli(["measure", "--graph", SPEC, "--gpus", "4", "--grids", "2x2x2", "--log", str(tmp_path / "r.jsonl")])
    assert code == 2 and stderr.strip() == "plexus-tune: error: grid 2x2x2 has 8 ranks, not the GPU count 4 (--grids)"
    code, _, stderr = run_cli(["measure", "--graph", SPEC, "--gpus", "4", "--grids", "top:2", "--log", str(tmp_path / "r.jsonl")])
    assert code == 2 and stderr.strip().endswith("need a machine profile to rank the grids (--machine)")
    # several parameters: each flag the command has; a command without such options adds none
    code, _, stderr = run_cli(["predict", "--dataset", "no-such-graph", "--gpus", "4", "--machine", "perlmutter"])
    assert code == 2 and stderr.strip().endswith("(or give the graph's sizes) (--nodes/--nnz/--features/--classes)")
    code, _, stderr = run_cli(["search", "--dataset", "no-such-graph", "--gpus", "4", "--machine", "perlmutter"])
    assert code == 2 and stderr.strip().endswith("(or give the graph's sizes)")
    # a sub-command's option, found in the sub-command's parser
    (tmp_path / "g.npz").write_bytes(b"taken")
    code, _, stderr = run_cli(["graph", "generate", "rmat", "--nodes", "256", "--out", str(tmp_path / "g.npz")])
    assert code == 2 and stderr.strip().endswith("already exists; remove it or allow overwriting (--force)")
