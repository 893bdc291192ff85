"""docs/architecture.md's "Where to change what" names files that exist, and covers the likely
changes; its Layers table is the order pyproject's layers contract holds; the extender's front door
resolves every name it promises."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

import scheduler_ext.api

REPO = Path(__file__).resolve().parents[2]
ARCHITECTURE = REPO / "docs" / "architecture.md"
SECTION = "## Where to change what"
LIKELY_CHANGES = (
    "a GPU model",
    "a resource kind",
    "a placement score term",
    "something both node-agent modes serve",
    "a health signal",
    "an Xid rule",
    "a Kubernetes API version",
    "a metric",
    "a chart value",
)
# A path in backticks: a top-level folder of the repository, then at least one more part.
PATH_IN_TICKS = re.compile(r"`([A-Za-z_][\w.-]*/[\w./-]*)`")


def section_rows(text: str) -> dict[str, list[str]]:
    """The section's table: change -> the paths its row names (files and folders)."""
    start = text.index(SECTION) + len(SECTION)
    end = text.find("\n## ", start)
    rows: dict[str, list[str]] = {}
    for line in text[start : end if end >= 0 else None].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[0] or cells[0] == "change" or set(cells[0]) <= {"-"}:
            continue
        rows[cells[0]] = PATH_IN_TICKS.findall(" ".join(cells[1:]))
    return rows


def missing_paths(rows: dict[str, list[str]], root: Path) -> list[str]:
    named = [(change, path) for change, paths in rows.items() for path in paths]
    return [f"{change}: {path}" for change, path in named if not (root / path).exists()]


def test_every_likely_change_has_a_row_naming_files() -> None:
    rows = section_rows(ARCHITECTURE.read_text())
    assert [change for change in LIKELY_CHANGES if not rows.get(change)] == []


def test_every_path_the_section_names_exists() -> None:
    rows = section_rows(ARCHITECTURE.read_text())
    assert sum(len(paths) for paths in rows.values()) >= 30  # the parse found the table
    assert missing_paths(rows, REPO) == []


def test_a_row_naming_a_missing_file_is_reported(tmp_path: Path) -> None:
    (tmp_path / "health").mkdir()
    (tmp_path / "health" / "xid.py").write_text("")
    table = "| change | files |\n|---|---|\n| an Xid rule | `health/xid.py`, `health/gone.py` |\n"
    text = f"{SECTION}\n\n{table}"
    assert missing_paths(section_rows(text), tmp_path) == ["an Xid rule: health/gone.py"]


def layers_in_doc(text: str) -> list[str]:
    """The Layers table's package cells, top to bottom, as ``a | b`` (the contract's spelling)."""
    start = text.index("## Layers")
    rows = []
    for line in text[start : text.index("\n### ", start)].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if len(cells) >= 3 and cells[0].isdigit():
            rows.append(" | ".join(re.findall(r"`(\w+)`", cells[1])))
    return rows


def test_the_layers_table_is_the_contract() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    layers = next(c["layers"] for c in contracts if c["type"] == "layers" and "containers" not in c)
    assert layers_in_doc(ARCHITECTURE.read_text()) == layers


@pytest.mark.parametrize("name", scheduler_ext.api.__all__)
def test_the_extender_front_door_has_every_name_it_exports(name: str) -> None:
    assert getattr(scheduler_ext.api, name) is not None
