"""The package installs with its machine profiles.

Builds the sdist and, from it, the wheel (``python -m build --no-isolation``) from a copy
of the checkout, installs the wheel non-editably into a fresh virtual environment (no pip
of its own; the running environment's site-packages made visible with a ``.pth`` file so
that nothing is downloaded) and runs the installed ``plexus-tune`` from a directory
outside the checkout. An editable install of the copy must find the profiles too.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import venv
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # builds and installs the package

pytest.importorskip("build", reason="python -m build is needed (dev extra)")
pytest.importorskip("setuptools", reason="the build backend is needed (dev extra)")

REPO = Path(__file__).resolve().parents[1]
#: What the build reads; copied so that building writes nothing into the checkout.
SOURCE_ENTRIES = ("pyproject.toml", "README.md", "MANIFEST.in", "plexus_tune", "models", "docs")
PROFILES = sorted(p.name for p in (REPO / "models").glob("*.json"))
MODULES = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "plexus_tune").rglob("*.py"))


def _run(cmd, cwd, env=None, timeout=180):
    result = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, f"{cmd} exited {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout


def _clean_env(**extra) -> dict:
    """The environment without anything that points into the checkout."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PLEXUS_TUNE_MODELS", "PYTHONHOME")}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_ROOT_USER_ACTION="ignore", PIP_NO_INPUT="1",
               PYTHONDONTWRITEBYTECODE="1", COLUMNS="200", **extra)
    return env


def _make_venv(path: Path) -> tuple[Path, Path]:
    """A virtual environment without pip that sees this interpreter's site-packages
    after its own; returns (python, site-packages)."""
    venv.EnvBuilder(with_pip=False, symlinks=os.name != "nt").create(path)
    python = path / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], path).strip())
    parents = [p for p in sys.path if p.rstrip("/\\").endswith(("site-packages", "dist-packages"))]
    (site / "parent_environment.pth").write_text("\n".join(parents) + "\n", encoding="utf-8")
    return python, site


def _pip_install(python: Path, *args, cwd: Path) -> None:
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-deps", "--no-index",
          "--no-build-isolation", *args], cwd, env=_clean_env())


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(source copy, sdist, wheel) built from a copy of the checkout."""
    tmp = tmp_path_factory.mktemp("install")
    src = tmp / "src"
    src.mkdir()
    for name in SOURCE_ENTRIES:
        item = REPO / name
        if item.is_dir():
            shutil.copytree(item, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        elif item.exists():
            shutil.copy2(item, src / name)
    dist = tmp / "dist"
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", dist, src], tmp, env=_clean_env())
    (sdist,) = dist.glob("*.tar.gz")
    (wheel,) = dist.glob("*.whl")
    return src, sdist, wheel


@pytest.fixture(scope="module")
def installed(built, tmp_path_factory):
    """(venv bin directory, installed package directory, a working directory outside the checkout)."""
    _, _, wheel = built
    tmp = tmp_path_factory.mktemp("venv")
    python, site = _make_venv(tmp / "venv")
    _pip_install(python, wheel, cwd=tmp)
    work = tmp / "work"
    work.mkdir()
    return python.parent, site / "plexus_tune", work


def test_sdist_holds_the_profiles_and_every_module(built):
    _, sdist, _ = built
    with tarfile.open(sdist) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    assert PROFILES and {f"models/{p}" for p in PROFILES} <= names
    assert {"models/README.md", "docs/profiles.md", "docs/architecture.md"} <= names
    assert set(MODULES) <= names, sorted(set(MODULES) - names)


def test_wheel_holds_the_profiles_and_every_module(built):
    _, _, wheel = built
    with zipfile.ZipFile(wheel) as whl:
        names = set(whl.namelist())
    assert {f"plexus_tune/profiles/{p}" for p in PROFILES} <= names
    missing = set(MODULES) - names
    assert not missing, f"modules left out of the wheel (add their package to pyproject.toml): {sorted(missing)}"
    assert not any(n.startswith("models/") for n in names)


def test_installed_package_finds_its_own_profiles(installed):
    bindir, package, work = installed
    code = ("import json, plexus_tune\nfrom plexus_tune.model.machine import models_dirs\n"
            "print(json.dumps([plexus_tune.__file__, [str(d) for d in models_dirs()]]))")
    module, dirs = json.loads(_run([bindir / "python", "-c", code], work, env=_clean_env()))
    assert Path(module).resolve() == (package / "__init__.py").resolve()
    assert [Path(d).resolve() for d in dirs] == [(package / "profiles").resolve()]
    assert sorted(p.name for p in (package / "profiles").glob("*.json")) == PROFILES


def test_installed_cli_lists_and_uses_the_shipped_profiles(installed):
    bindir, package, work = installed
    exe = bindir / "plexus-tune"
    table = _run([exe, "machines"], work, env=_clean_env())
    assert "perlmutter" in table and "frontier" in table
    listed = json.loads(_run([exe, "machines", "--format", "json"], work, env=_clean_env()))
    assert sorted(f"{e['name']}.json" for e in listed) == PROFILES
    assert all(e["problem"] is None for e in listed), [e["problem"] for e in listed]
    assert {Path(e["path"]).resolve().parent for e in listed} == {(package / "profiles").resolve()}

    argv = ["predict", "--dataset", "reddit", "--gpus", "64", "--machine", "perlmutter", "--format", "json"]
    installed_out = json.loads(_run([exe, *argv], work, env=_clean_env()))
    checkout_out = json.loads(_run([sys.executable, "-m", "plexus_tune", *argv], work,
                                   env=_clean_env(PYTHONPATH=str(REPO))))
    assert installed_out == checkout_out
    assert _run([exe, *argv[:-2]], work, env=_clean_env()).strip()


def test_user_profiles_are_searched_before_the_shipped_ones(installed, tmp_path):
    bindir, package, work = installed
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    profile = json.loads((REPO / "models" / "perlmutter.json").read_text(encoding="utf-8"))
    (first / "perlmutter.json").write_text(json.dumps({**profile, "description": "user copy"}), encoding="utf-8")
    (second / "perlmutter.json").write_text(json.dumps({**profile, "description": "shadowed"}), encoding="utf-8")
    (second / "mine.json").write_text(json.dumps({**profile, "name": "mine", "description": "mine"}),
                                      encoding="utf-8")
    env = _clean_env(PLEXUS_TUNE_MODELS=os.pathsep.join([str(first), str(second)]))
    listed = {e["name"]: e for e in json.loads(_run([bindir / "plexus-tune", "machines", "--format", "json"],
                                                    work, env=env))}
    assert listed["perlmutter"]["description"] == "user copy"
    assert Path(listed["perlmutter"]["path"]).parent == first
    assert Path(listed["mine"]["path"]).parent == second
    assert Path(listed["frontier"]["path"]).resolve().parent == (package / "profiles").resolve()
    assert sorted(f"{name}.json" for name in listed) == sorted(PROFILES + ["mine.json"])


def test_editable_install_finds_the_checkout_profiles(built, tmp_path):
    src, _, _ = built
    python, _ = _make_venv(tmp_path / "venv")
    _pip_install(python, "--editable", src, cwd=tmp_path)
    code = ("import json, plexus_tune\nfrom plexus_tune.model.machine import models_dirs\n"
            "print(json.dumps([plexus_tune.__file__, [str(d) for d in models_dirs()]]))")
    module, dirs = json.loads(_run([python, "-c", code], tmp_path, env=_clean_env()))
    assert Path(module).resolve() == (src / "plexus_tune" / "__init__.py").resolve()
    assert [Path(d).resolve() for d in dirs] == [(src / "models").resolve()]
