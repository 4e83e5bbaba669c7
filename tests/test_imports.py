"""The import rules of docs/architecture.md: internal modules are imported at module
level; a function imports one of them only when that module (transitively) imports
torch, optuna, matplotlib or pandas at module level, which ``plexus-tune predict`` must
not load."""

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "plexus_tune"
HEAVY = {"torch", "optuna", "matplotlib", "pandas"}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _module_level_imports(tree: ast.Module) -> list:
    """Import statements run when the module is imported (not those under TYPE_CHECKING)."""
    found = []

    def visit(body):
        for node in body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found.append(node)
            elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)
                visit(node.finalbody)

    visit(tree.body)
    return found


def _imported(node, module: str) -> list[str]:
    """Full names a statement imports (``from a import b`` gives a.b when that is a module)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module.split(".")
        if MODULES[module].name != "__init__.py":
            package = package[:-1]
        package = package[:len(package) - (node.level - 1)]
        base = ".".join(package + ([base] if base else []))
    return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]


def _with_packages(name: str) -> set[str]:
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts) + 1)}


TREES = {name: ast.parse(path.read_text(), filename=str(path)) for name, path in MODULES.items()}
EDGES = {name: set().union(*[_with_packages(t) for node in _module_level_imports(tree) for t in _imported(node, name)])
         for name, tree in TREES.items()}


def _heavy(module: str) -> bool:
    """Whether importing ``module`` imports torch, optuna, matplotlib or pandas."""
    seen, todo = set(), [module]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for target in EDGES.get(name, ()):
            if target.split(".")[0] in HEAVY:
                return True
            if target in MODULES:
                todo.append(target)
    return False


def test_internal_modules_are_imported_at_module_level():
    lazy = []
    for name, tree in TREES.items():
        top = set(map(id, _module_level_imports(tree)))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in top:
                for target in _imported(node, name):
                    if target.split(".")[0] == "plexus_tune" and not _heavy(target):
                        lazy.append(f"{MODULES[name].relative_to(PACKAGE.parent)}:{node.lineno} imports {target}")
    assert not lazy, "import these at module level:\n" + "\n".join(lazy)


def test_rule_sees_the_heavy_modules():
    # the check above is only as good as its notion of "heavy"
    assert _heavy("plexus_tune.trainer.rank")
    assert not _heavy("plexus_tune.model.costs") and not _heavy("plexus_tune.cli")


def test_predict_loads_no_torch_optuna_matplotlib_or_pandas():
    code = ("import sys, io, contextlib; from plexus_tune.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    rc = main(['predict', '--dataset', 'reddit', '--gpus', '8', '--machine', 'perlmutter'])\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'optuna', 'matplotlib', 'pandas', 'sklearn', 'scipy'}))\n"
            "sys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120,
                          cwd=PACKAGE.parent)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_the_model_stage_loads_numpy_only():
    """``import plexus_tune.model.prediction`` (every family's model) loads none of the heavy
    libraries: the estimators live in fit/, graph helpers load scipy when called."""
    code = ("import sys; import plexus_tune.model.prediction, plexus_tune.model.planner, plexus_tune.model.estimator\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'scipy', 'sklearn', 'pandas', 'torch', 'optuna', 'matplotlib'}))")
    proc = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120,
                          cwd=PACKAGE.parent)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
