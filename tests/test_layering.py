"""No module imports a later stage of the data flow (docs/architecture.md, "Layout").

The stages, in order: a graph is loaded; the model predicts it; launchers start ranks
(on clusters); the trainer trains; measurements log runs and microbenchmarks; fits
estimate profiles from them; the report validates and draws; search runs everything
below it (measured search trains); the command line parses and prints. A module may
import its own stage and earlier ones, and the stage-free helpers.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "plexus_tune"

#: The stages of the data flow, earliest first; each is a subpackage of plexus_tune
#: (the emulated cluster belongs with the launchers).
STAGES = ("graph", "model", "launch", "trainer", "measure", "fit", "report", "search", "cli")
#: Subpackages that are part of a stage.
SAME_STAGE = {"cluster": "launch"}
#: Modules every stage may import: errors, numbers, paths and resources (no stage's logic), the
#: call-path tracer (it imports no stage), the package itself and its entry point.
STAGE_FREE = {"errors", "numbers", "paths", "resources", "allocator", "jsonfile", "callpath", "__init__", "__main__"}


def stage_of(module: str) -> str | None:
    """The stage of ``plexus_tune.<name>...`` (None for the stage-free helpers)."""
    parts = module.split(".")
    if parts[0] != "plexus_tune" or len(parts) == 1:
        return None
    name = SAME_STAGE.get(parts[1], parts[1])
    return None if name in STAGE_FREE else name


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every plexus_tune import of a file, relative ones resolved."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            out += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return [(line, name) for line, name in out if name.startswith("plexus_tune.")]


MODULES = sorted(PACKAGE.rglob("*.py"))


def test_every_module_belongs_to_a_stage():
    loose = [module_name(p) for p in MODULES if stage_of(module_name(p)) is None
             and module_name(p).split(".")[-1] not in STAGE_FREE and module_name(p) != "plexus_tune"]
    assert not loose, f"modules outside every stage (put them in one of {', '.join(STAGES)}): {loose}"
    unknown = {stage_of(module_name(p)) for p in MODULES} - set(STAGES) - {None, "profiles"}
    assert not unknown, f"subpackages without a stage: {sorted(unknown)}; add them to STAGES or SAME_STAGE"


def test_no_module_imports_a_later_stage():
    later = []
    for path in MODULES:
        own = stage_of(module_name(path))
        if own is None:
            continue
        for line, target in imported(path):
            theirs = stage_of(target)
            if theirs in STAGES and STAGES.index(theirs) > STAGES.index(own):
                later.append(f"{path.relative_to(PACKAGE.parent)}:{line} ({own}) imports {target} ({theirs})")
    assert not later, "imports of a later stage:\n" + "\n".join(later)


@pytest.mark.parametrize("module, target, bad", [
    ("plexus_tune.model.costs", "plexus_tune.trainer.run", True),
    ("plexus_tune.trainer.run", "plexus_tune.measure.records", True),
    ("plexus_tune.cluster.emulated", "plexus_tune.launch.local", False),
    ("plexus_tune.measure.training", "plexus_tune.trainer.run", False),
    ("plexus_tune.report.figures", "plexus_tune.search.study", True),
    ("plexus_tune.model.costs", "plexus_tune.errors", False),
])
def test_the_order_judges_an_import(module, target, bad):
    own, theirs = stage_of(module), stage_of(target)
    assert (theirs is not None and STAGES.index(theirs) > STAGES.index(own)) == bad


#: The longest a function of the command line may be: it parses, calls the library and prints
#: (docs/architecture.md, "Rules the layout keeps").
CLI_FUNCTION_LINES = 40


def cli_function_lengths() -> list[tuple[int, str]]:
    """(lines, cli/module:function) of every function in plexus_tune/cli, nested ones and methods included."""
    out = []
    for path in sorted((PACKAGE / "cli").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append((node.end_lineno - node.lineno + 1, f"cli/{path.stem}:{node.name} (line {node.lineno})"))
    return sorted(out, reverse=True)


def test_cli_functions_are_short():
    lengths = cli_function_lengths()
    assert len(lengths) > 100  # the walk found the command line's functions
    long = [f"{name}: {n} lines" for n, name in lengths if n > CLI_FUNCTION_LINES]
    assert not long, (f"command-line functions over {CLI_FUNCTION_LINES} lines (move the work into the library, "
                      "keep parse -> call -> print):\n" + "\n".join(long))
