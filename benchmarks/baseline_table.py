"""The baselines table: published vs reproduced GPU allocation at 130% per trace, with the bound.

Reads a ``placement.json`` (``benchmarks.placement``) and optionally an ``upper_bound.json``
(``benchmarks.upper_bound``) and prints one Markdown row per trace: for each baseline the
artifact's published 10-seed median, ours (median over the run's seeds) and the difference, marked
``!`` beyond ``TOLERANCE``; then the offline bound and packer.

    .venv/bin/python -m benchmarks.baseline_table --placement DIR/placement.json --bound DIR/upper_bound.json
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BASELINES = ("fgd", "best-fit", "dot-product", "random")
TOLERANCE = 0.3  # points of allocation at 130%
AT = 130


def _at(curve: Sequence[float] | None) -> float:
    return math.nan if curve is None else float(curve[AT])


def rows(placement: dict[str, Any], bound: dict[str, Any] | None) -> list[str]:
    """The table's Markdown lines (header first)."""
    head = ["trace"] + [f"{b} pub / here / diff" for b in BASELINES] + ["bound", "offline pack"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for variant, data in placement["variants"].items():
        cells = [variant]
        for name in BASELINES:
            here = _at(data["ours"].get(name, {}).get("median", {}).get("allocation"))
            published = _at(data["published"].get(name, {}).get("allocation"))
            diff = here - published
            mark = " !" if abs(diff) > TOLERANCE else ""
            cells.append(f"{published:.2f} / {here:.2f} / {diff:+.2f}{mark}")
        medians = (bound or {}).get("variants", {}).get(variant, {}).get("median", {})
        cells += [f"{medians.get(m, math.nan):.2f}" for m in ("bound", "offline_pack")]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks.baseline_table", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--placement", type=Path, required=True, help="placement.json of benchmarks.placement"
    )
    parser.add_argument("--bound", type=Path, help="upper_bound.json of benchmarks.upper_bound")
    args = parser.parse_args(argv)
    placement = json.loads(args.placement.read_text())
    bound = json.loads(args.bound.read_text()) if args.bound else None
    print("\n".join(rows(placement, bound)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
