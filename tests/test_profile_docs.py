"""docs/profiles.md documents every profile field, and models/README.md every shipped profile."""

import json
import re
from pathlib import Path

from plexus_tune.model.costs import predict_grids
from plexus_tune.model.grid import enumerate_grids
from plexus_tune.model.machine import FIELDS, Machine
from plexus_tune.model.workload import workload_from_dataset

REPO = Path(__file__).resolve().parents[1]
DOC = (REPO / "docs" / "profiles.md").read_text(encoding="utf-8")
PROFILES = sorted((REPO / "models").glob("*.json"))


def _documented(key: str) -> bool:
    return f"`{key}`" in DOC


def test_every_field_is_documented():
    assert [key for key in FIELDS if not _documented(key)] == []
    for path in PROFILES:
        data = json.loads(path.read_text(encoding="utf-8"))
        keys = list(data) + [f"collectives.{k}" for k in data["collectives"]]
        assert [k for k in keys if not _documented(k)] == [], path.name


def test_sections_that_others_extend_exist():
    headings = re.findall(r"^## (.+)$", DOC, flags=re.MULTILINE)
    assert "spmm" in headings and "collectives" in headings


def test_example_profile_is_valid():
    (example,) = re.findall(r"```json\n(\{\n.*?\n\})\n```", DOC, flags=re.DOTALL)
    machine = Machine.from_dict(json.loads(example))
    assert machine.name == "mycluster" and machine.usable_memory_bytes == 78 * 2**30
    pred = predict_grids(workload_from_dataset("ogbn-products"), machine, enumerate_grids(16))
    assert pred["feasible"].all() and (pred["total_ms"] > 0).all()


def test_models_readme_lists_every_shipped_profile():
    readme = (REPO / "models" / "README.md").read_text(encoding="utf-8")
    assert [p.stem for p in PROFILES if f"`{p.stem}`" not in readme] == []
    assert "docs/profiles.md" in readme
