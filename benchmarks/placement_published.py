"""The FGD artifact's published result curves (``fgd-atc23-results``), parsed for comparison.

Each CSV row is one run (trace, policy, seed) with columns ``0``..``130`` (arrived load, % of
cluster GPU capacity). We take the median over seeds per (trace, policy), as the paper plots.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from devicemodel.errors import InvalidInputError

RESULT_FILES = {
    "allocation": "analysis_allo_discrete.csv",
    "fragment_total": "analysis_frag_discrete.csv",
    "fragment_idle": "analysis_frag_ratio_discrete.csv",
}
# Artifact policy names -> ours.
POLICY_ALIASES = {
    "01-Random": "random",
    "02-DotProd": "dot-product",
    "03-GpuClustering": "gpu-clustering",
    "04-GpuPacking": "gpu-packing",
    "05-BestFit": "best-fit",
    "06-FGD": "fgd",
}
PERCENTS = range(131)


@dataclass(frozen=True)
class PublishedCurves:
    """metric -> variant -> policy -> median curve (131 values, NaN where missing)."""

    curves: dict[str, dict[str, dict[str, list[float]]]]

    def curve(self, metric: str, variant: str, policy: str) -> list[float] | None:
        return self.curves.get(metric, {}).get(variant, {}).get(policy)

    def policies(self, variant: str) -> list[str]:
        return sorted(self.curves.get("allocation", {}).get(variant, {}))


def _median(values: list[float]) -> float:
    finite = sorted(v for v in values if not math.isnan(v))
    if not finite:
        return math.nan
    middle = len(finite) // 2
    return finite[middle] if len(finite) % 2 else (finite[middle - 1] + finite[middle]) / 2


def _value(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


def _medians(path: Path) -> dict[str, dict[str, list[float]]]:
    runs: dict[tuple[str, str], list[list[float]]] = {}
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            variant = row["workload"].removeprefix("openb_pod_list_")
            policy = POLICY_ALIASES.get(row["sc_policy"], row["sc_policy"])
            runs.setdefault((variant, policy), []).append([_value(row.get(str(p), "")) for p in PERCENTS])
    result: dict[str, dict[str, list[float]]] = {}
    for (variant, policy), curves in runs.items():
        result.setdefault(variant, {})[policy] = [_median([c[p] for c in curves]) for p in PERCENTS]
    return result


def load_published(results_dir: Path) -> PublishedCurves:
    """Median curves of every published run; a clear error if the folder is not the artifact's."""
    missing = [name for name in RESULT_FILES.values() if not (results_dir / name).is_file()]
    if missing:
        raise InvalidInputError(
            f"published FGD results not found in {results_dir} (missing {missing}); point "
            "--published-dir at the fgd-atc23-results folder"
        )
    return PublishedCurves({metric: _medians(results_dir / name) for metric, name in RESULT_FILES.items()})
