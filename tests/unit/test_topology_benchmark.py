"""The topology search benchmark runs end to end and writes its JSON (one request per cell)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.topology_search import main


@pytest.mark.slow
def test_benchmark_writes_json_and_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    output = tmp_path / "topology_search.json"
    assert main(["--requests", "1", "--output", str(output)]) == 0
    report = json.loads(output.read_text(encoding="utf-8"))
    modes = {row["mode"] for row in report["rows"]}
    assert modes == {"cold", "warm", "cold-no-lookahead", "go-gpuallocator-like"}
    assert {row["gpus"] for row in report["rows"]} == {8, 16}
    assert all(row["p99_ms"] >= row["p50_ms"] >= 0 for row in report["rows"])
    assert "p50 ms" in capsys.readouterr().out
