"""The placement benchmark's results file: the figures the docs quote, from a tiny report."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks.placement import main, summary, summary_rows

LOADS = range(131)


LEFT = {
    "idle_gpus": 3,
    "idle_gpus_short_of": {"cpu": 2, "memory": 1},
    "partly_used_gpus": 7,
    "leftover_gpus": 2.5,
    "smallest_failed_share_milli": 220,
    "leftover_gpus_below_it": 1.25,
    "leftover_histogram_milli": {100: 7},
    "failed_by_request": {"1 GPU": 4},
}


def _run(seed: int, allocation: list[float], fragment: float) -> dict[str, object]:
    return {"seed": seed, "allocation": allocation, "fragment_total": [fragment] * 131, "left": LEFT}


def _policy(runs: list[dict[str, object]], median: list[float], fragment: float) -> dict[str, object]:
    return {"median": {"allocation": median, "fragment_total": [fragment] * 131}, "runs": runs}


def _report() -> dict[str, object]:
    """Two seeds; FGD fills to 90 / 92. gpuweave: seed 1 +0.5 from 95% but -0.1 at 100%, seed 2
    +0.3 from 80%. No value at load 3 (an empty bin). The published FGD 0.2 under the median."""
    fgd = [[min(float(x), cap) for x in LOADS] for cap in (90.0, 92.0)]
    bump1 = [0.0 if x < 95 else (-0.1 if x == 100 else 0.5) for x in LOADS]
    bump2 = [0.0 if x < 80 else 0.3 for x in LOADS]
    ours = [
        [f + b for f, b in zip(c, bump, strict=True)] for c, bump in zip(fgd, (bump1, bump2), strict=True)
    ]
    for curve in (*fgd, *ours):
        curve[3] = math.nan
    fgd_median = [(a + b) / 2 for a, b in zip(*fgd, strict=True)]
    ours_median = [(a + b) / 2 for a, b in zip(*ours, strict=True)]
    return {
        "method": {"seeds": [1, 2]},
        "variants": {
            "tiny": {
                "ours": {
                    "fgd": _policy([_run(1, fgd[0], 5.0), _run(2, fgd[1], 5.0)], fgd_median, 5.0),
                    "gpuweave": _policy([_run(1, ours[0], 4.0), _run(2, ours[1], 4.0)], ours_median, 4.0),
                },
                "published": {"fgd": {"allocation": [v - 0.2 for v in fgd_median]}},
            }
        },
    }


def test_the_summary_holds_the_figures_the_docs_tables_show() -> None:
    tiny = summary(_report())["variants"]["tiny"]
    assert tiny["policies"]["fgd"]["at_130"] == 91.0
    assert tiny["policies"]["fgd"]["seeds_at_130"] == {"1": 90.0, "2": 92.0}
    assert tiny["policies"]["gpuweave"]["seeds_at_130"] == {"1": 90.5, "2": 92.3}
    assert tiny["policies"]["gpuweave"]["fragment_total_at_130"] == 4.0
    assert tiny["policies"]["fgd"]["left_at_130"]["2"] == {
        "idle_gpus": 3,
        "idle_gpus_short_of_cpu": 2,
        "idle_gpus_short_of_memory": 1,
        "partly_used_gpus": 7,
        "leftover_gpus": 2.5,
        "smallest_failed_share_milli": 220,
        "leftover_gpus_below_it": 1.25,
        "failed_by_request": {"1GPU": 4},
    }
    gap = tiny["gpuweave_minus_fgd"]
    assert gap["at_130"] == pytest.approx(0.4)
    assert (gap["min_gap"], gap["min_gap_load"]) == (0.0, 0)
    assert (gap["min_gap_100_130"], gap["min_gap_100_130_load"]) == (pytest.approx(0.1), 100)
    assert gap["curves_differ_from"] == 80
    assert gap["by_load"][3] is None and gap["by_load"][80] == pytest.approx(0.15)
    seed1, seed2 = gap["per_seed"]["1"], gap["per_seed"]["2"]
    assert (seed1["min_gap"], seed1["min_gap_load"], seed1["curves_differ_from"]) == (
        pytest.approx(-0.1),
        100,
        95,
    )
    assert (seed2["min_gap"], seed2["curves_differ_from"], seed2["at_130"]) == (0.0, 80, pytest.approx(0.3))
    assert "by_load" not in seed1
    assert (gap["seeds_ahead_at_130"], gap["seeds_compared"]) == (2, 2)
    assert tiny["published_fgd"]["at_130"] == pytest.approx(90.8)
    assert tiny["published_fgd"]["gpuweave_min_gap"] == pytest.approx(0.2)


def test_the_docs_table_row_and_summarize_read_a_written_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert summary_rows(summary(_report()))[2:] == [
        "| tiny | 91.40 | 91.00 | +0.40 | 0.00 (never below) | 80% | +0.10 at 100% |"
    ]
    path = tmp_path / "placement.json"
    path.write_text(json.dumps(_report(), allow_nan=True))
    assert main(["--summarize", str(path)]) == 0
    assert "| tiny | 91.40 | 91.00 | +0.40 |" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--summarize", str(path), "--results", "x"])  # no --run-command: refused, nothing written
