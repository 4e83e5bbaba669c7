"""The README's examples are checked: each shown command runs, and the output shown below it
must appear in what the command prints.

An example is a ``$ plexus-tune ...`` line in a fenced block followed by output lines (table
borders trimmed). Each shown line must match a printed line: the same words in the same
order, and numbers equal within the display rounding, or within a host tolerance for the
lines whose figures depend on the machine (timings, memory). The loop of commands without
output (the block after "A whole loop") runs in an empty directory and may leave only what
``.gitignore`` lists.

Every ``python`` block of the README and of docs/*.md runs in a fresh interpreter in the
repository root; each ``# prints: TEXT`` line in it must be a line the block printed.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from plexus_tune.cli import main

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")
BOX = str.maketrans({c: " " for c in "┃│┏┓┗┛┡┩━─┳┻╇"})
NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?")


def examples() -> list[tuple[str, list[str]]]:
    """(command after ``plexus-tune``, shown output lines) of every ``$ plexus-tune`` line."""
    out = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", README, flags=re.S):
        current = None
        for line in block.splitlines():
            if line.startswith("$ plexus-tune "):
                command = re.sub(r"\s{2,}\(.*\)\s*$", "", line[len("$ plexus-tune "):])  # "(balance part)"
                current = (command, [])
                out.append(current)
            elif current is not None and line.strip():
                current[1].append(line)
    return out


def loop_commands() -> list[str]:
    block = README.split("A whole loop", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    return [line[len("plexus-tune "):] for line in block.splitlines() if line.startswith("plexus-tune ")]


def tokens(line: str) -> list:
    out = []
    for raw in line.translate(BOX).split():
        token = raw.strip(",;:()")
        if token and NUMBER.fullmatch(token):
            out.append(float(token.replace(",", "")))
        elif token:
            out.append(token)
    return out


def same(shown: str, printed: str, rel: float) -> bool:
    a, b = tokens(shown), tokens(printed)
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if isinstance(x, float) != isinstance(y, float):
            return False
        if isinstance(x, float):
            if rel is not None and abs(x - y) > max(rel * abs(x), 0.0051):  # 0.0051: two-decimal display rounding
                return False
        elif x != y:
            return False
    return True


def check_output(command: str, shown: list[str], printed: str, *, rel: float = 2e-3, host_lines=(), host_rel=None):
    """Every shown line matches a printed one; in lines starting with one of ``host_lines`` numbers
    may differ by ``host_rel`` (None: any number)."""
    lines = [line for line in printed.splitlines() if line.strip()]
    for want in shown:
        tol = host_rel if any(want.startswith(p) for p in host_lines) else rel
        assert any(same(want, got, tol) for got in lines), (
            f"README shows for `plexus-tune {command}`:\n  {want}\nbut the command prints:\n" + "\n".join(lines))


def _example(prefix: str) -> tuple[str, list[str]]:
    found = [e for e in examples() if e[0].startswith(prefix)]
    assert found, f"README has no example `plexus-tune {prefix}...`"
    return found[0]


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PLEXUS_TUNE_DATA", str(tmp_path / "data"))
    return tmp_path


def _run(command: str, capsys) -> str:
    capsys.readouterr()
    code = main(shlex.split(command))
    out, err = capsys.readouterr()
    assert code == 0, (command, out, err)
    return out


def test_every_readme_example_is_checked_here():
    checked = ("predict --dataset ogbn-products", "predict --algorithm all", "graph generate grid2d", "graph stats road", "train --synthetic",
               "search --dataset ogbn-papers100M")
    commands = [c for c, _ in examples()]
    assert all(any(c.startswith(p) for p in checked) for c in commands), commands
    assert len(loop_commands()) == 4


def test_predict_example(workdir, capsys):
    command, shown = _example("predict --dataset ogbn-products")
    check_output(command, shown, _run(command, capsys))


def test_predict_algorithm_all_example(workdir, capsys):
    command, shown = _example("predict --algorithm all")
    check_output(command, shown, _run(command, capsys))


def test_graph_generate_and_stats_example(workdir, capsys):
    for prefix in ("graph generate grid2d", "graph stats road"):
        command, shown = _example(prefix)
        check_output(command, shown, _run(command, capsys), rel=1e-9)


@pytest.mark.slow
def test_search_example(workdir, capsys):
    command, shown = _example("search --dataset ogbn-papers100M")
    check_output(command, shown, _run(command, capsys))


@pytest.mark.slow
def test_train_example(workdir, capsys):
    """Timings, memory and the check's rounding-level differences depend on the host; graph,
    grid, losses and the verdict do not."""
    command, shown = _example("train --synthetic")
    out = _run(command, capsys)
    check_output(command, shown, out, rel=1e-4,
                 host_lines=("epoch ", "breakdown", "largest per rank", "peak memory", "check against serial PyG", "accuracy"))
    assert "PASSED" in out


@pytest.mark.slow
def test_the_loop_runs_and_leaves_only_ignored_files(workdir, capsys):
    for command in loop_commands():
        _run(command, capsys)
    ignored = {line.strip().strip("/") for line in (REPO / ".gitignore").read_text().splitlines()}
    left = {p.name for p in workdir.iterdir()} - {"data"}
    assert left and left <= ignored, (left, ignored)


#: The documents whose Python blocks are executed.
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def python_blocks() -> list[tuple[str, int, str]]:
    """(document, block number, code) of every fenced ``python`` block."""
    out = []
    for path in DOCUMENTS:
        blocks = re.findall(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), flags=re.S)
        out += [(path.relative_to(REPO).as_posix(), i, code) for i, code in enumerate(blocks, start=1)]
    return out


BLOCKS = python_blocks()


def test_the_readme_and_docs_have_python_blocks():
    assert sum(doc == "README.md" for doc, _, _ in BLOCKS) >= 2
    assert all("# prints: " in code for _, _, code in BLOCKS)  # each block says what it prints


@pytest.mark.parametrize("doc, number, code", BLOCKS, ids=[f"{d}#{n}" for d, n, _ in BLOCKS])
def test_python_block_runs_and_prints_what_it_shows(doc, number, code):
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{doc} block {number} failed:\n{proc.stderr[-3000:]}"
    printed = [line.rstrip() for line in proc.stdout.splitlines()]
    for shown in re.findall(r"^# prints: (.*)$", code, flags=re.M):
        assert shown.rstrip() in printed, f"{doc} block {number}: {shown!r} not among {printed}"
