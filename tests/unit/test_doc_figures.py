"""Figures the docs quote agree with the committed benchmark results they come from.

A sourced figure in docs/*.md is followed by a marker naming its results file and the value in
it: ``**2.46x**<!-- results: extender http_p50_over_bare_server.5000 -->``. The path is dotted
keys (a number indexes a list); ``rows[nodes=15000,mode=http]`` picks the one list item whose
fields match (a dot inside the brackets is the value's: ``rows[node=p5.48xlarge]``). The quoted
number must equal the file's value rounded to the decimals the doc shows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from benchmarks.results_file import RESULTS_DIR, read_results

DOCS = Path(__file__).resolve().parents[2] / "docs"
MARKED = re.compile(
    r"(?P<number>-?[0-9][0-9,]*(?:\.[0-9]+)?)[^0-9<]{0,12}?<!-- results: (?P<name>[\w.-]+) (?P<path>\S+) -->"
)
SELECTOR = re.compile(r"^(?P<key>\w+)\[(?P<match>[^\]]+)\]$")
STEP = re.compile(r"\.(?![^\[]*\])")  # a dot outside a selector's brackets: p5.48xlarge stays whole


@dataclass(frozen=True)
class Quoted:
    doc: str
    number: str
    name: str
    path: str


def quoted_figures(text: str, *, doc: str) -> list[Quoted]:
    return [Quoted(doc, m["number"], m["name"], m["path"]) for m in MARKED.finditer(text)]


def _step(value: Any, part: str) -> Any:
    selected = SELECTOR.match(part)
    if selected is None:
        return value[int(part)] if isinstance(value, list) else value[part]
    wanted = dict(pair.split("=", 1) for pair in selected["match"].split(","))
    items = [i for i in value[selected["key"]] if all(str(i.get(k)) == v for k, v in wanted.items())]
    if len(items) != 1:
        raise LookupError(f"{part}: {len(items)} items match, expected 1")
    return items[0]


def resolve(results: dict[str, Any], path: str) -> float:
    value: Any = results
    for part in STEP.split(path):
        value = _step(value, part)
    return float(value)


def disagreement(quoted: Quoted, results: dict[str, Any]) -> str | None:
    """None when the doc's number is the file's value at the doc's precision."""
    decimals = len(quoted.number.partition(".")[2])
    shown = float(quoted.number.replace(",", ""))
    actual = resolve(results, quoted.path)
    if round(actual, decimals) == shown:
        return None
    return f"{quoted.doc}: {quoted.number} but {quoted.name}.json {quoted.path} is {actual:.{decimals}f}"


def all_quoted() -> list[Quoted]:
    return [q for doc in sorted(DOCS.glob("*.md")) for q in quoted_figures(doc.read_text(), doc=doc.name)]


def test_the_docs_mark_their_sourced_figures() -> None:
    quoted = all_quoted()
    assert len(quoted) >= 8
    assert {q.name for q in quoted} >= {"extender", "simulate_default"}


@pytest.mark.parametrize("quoted", all_quoted(), ids=lambda q: f"{q.doc}:{q.name}:{q.path}")
def test_a_marked_figure_is_its_results_file_value(quoted: Quoted) -> None:
    assert disagreement(quoted, read_results(quoted.name)) is None


def test_every_results_file_says_how_when_and_where_it_was_measured() -> None:
    for path in sorted(RESULTS_DIR.glob("*.json")):
        results = read_results(path.stem)
        assert results["command"].startswith(".venv/bin/python -m benchmarks."), path.name
        assert re.match(r"^\d{4}-\d\d-\d\dT", results["date"]), path.name
        assert results["machine"]["cpus"] >= 1, path.name


def test_a_figure_that_differs_from_its_file_is_reported() -> None:
    rows = [{"nodes": 5000, "p99_ms": 12.5}, {"nodes": 15000, "p99_ms": 20.04}]
    results = {"ratio": {"5000": 2.4649}, "rows": rows}
    assert resolve({"rows": [{"node": "p5.48xlarge", "ms": 0.3}]}, "rows[node=p5.48xlarge].ms") == 0.3
    text = (
        "**2.46x**<!-- results: r ratio.5000 --> and 20.1 ms<!-- results: r rows[nodes=15000].p99_ms -->"
        " and 12.50 ms <!-- results: r rows[nodes=5000].p99_ms -->"
    )
    found = quoted_figures(text, doc="x.md")
    assert [q.number for q in found] == ["2.46", "20.1", "12.50"]
    assert [disagreement(q, results) for q in found] == [
        None,
        "x.md: 20.1 but r.json rows[nodes=15000].p99_ms is 20.0",
        None,
    ]
