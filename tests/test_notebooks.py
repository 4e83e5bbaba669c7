"""The notebooks run top to bottom (nbclient) on this interpreter, at small sizes."""

import json
import shutil
import os
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.slow  # executes the notebooks

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
KERNEL = "plexus-tune-tests"


@pytest.fixture()
def kernel_env(tmp_path, monkeypatch):
    """A kernel spec that starts this very interpreter (works in a fresh venv, no install step)."""
    spec_dir = tmp_path / "jupyter" / "kernels" / KERNEL
    spec_dir.mkdir(parents=True)
    spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "plexus-tune tests", "language": "python"}
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter") + os.pathsep + os.environ.get("JUPYTER_PATH", ""))
    return tmp_path


def execute(name, cwd):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    NotebookClient(nb, timeout=240, kernel_name=KERNEL, resources={"metadata": {"path": str(cwd)}}).execute()
    return nb


def outputs(nb, kind):
    return [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if kind in o.get("data", {})]


def text_of(nb):
    return "\n".join(o.get("text", "") + str(o.get("data", {}).get("text/plain", ""))
                     for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))


def test_quickstart(kernel_env):
    nb = execute("quickstart.ipynb", kernel_env)
    assert len(outputs(nb, "image/png")) >= 3  # breakdown, scaling, history
    text = text_of(nb)
    assert "search best" in text and "exhaustive best" in text
    # the search found the exhaustive optimum of 8..512 GPUs for ogbn-products
    line = next(l for l in text.splitlines() if l.startswith("search best"))
    found, exhaustive = line.split("; exhaustive best ")
    assert found.split()[-2] == exhaustive.split()[-2], line


def test_calibrate_a_machine(kernel_env):
    nb = execute("calibrate-a-machine.ipynb", kernel_env)
    assert len(outputs(nb, "image/png")) >= 1
    text = text_of(nb)
    assert "my-cpu" in text and "Spearman" in text
    workdir = next(l for l in text.splitlines() if "plexus-calibrate-" in l).strip()
    try:
        profile = json.loads(Path(workdir, "my-cpu.json").read_text())
        assert profile["name"] == "my-cpu" and "spmm" in profile and "collectives" in profile
        assert len(Path(workdir, "runs.jsonl").read_text().splitlines()) == 3  # one run per grid of 2 ranks
    finally:  # the notebook's working directory: nothing left in /tmp
        shutil.rmtree(workdir, ignore_errors=True)
