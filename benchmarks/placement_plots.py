"""PNGs for the placement benchmark: curves per variant and unallocated GPUs across variants."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

PANELS = (
    ("allocation", "GPU allocation (% of all GPUs)"),
    ("fragment_total", "GPU fragment (% of all GPUs)"),
    ("fragment_idle", "GPU fragment (% of idle GPUs)"),
)
COLOURS = {
    "random": "tab:gray",
    "dot-product": "tab:olive",
    "best-fit": "tab:blue",
    "fgd": "tab:orange",
    "gpuweave": "tab:green",
    "gpu-clustering": "tab:purple",
    "gpu-packing": "tab:brown",
}


def _xy(curve: list[float] | None) -> tuple[list[int], list[float]]:
    if not curve:
        return [], []
    points = [(x, y) for x, y in enumerate(curve) if y is not None and not math.isnan(y)]
    return [x for x, _ in points], [y for _, y in points]


def plot_variant(variant: str, data: dict[str, Any], out: Path) -> Path:
    figure, axes = plt.subplots(1, 3, figsize=(17, 5))
    for axis, (metric, label) in zip(axes, PANELS, strict=True):
        for policy, result in data["ours"].items():
            xs, ys = _xy(result["median"][metric])
            axis.plot(xs, ys, color=COLOURS.get(policy), linewidth=2, label=f"{policy} (here)")
        for policy, curves in data["published"].items():
            if policy in data["ours"]:
                xs, ys = _xy(curves[metric])
                axis.plot(
                    xs,
                    ys,
                    color=COLOURS.get(policy),
                    linestyle="--",
                    linewidth=1,
                    label=f"{policy} (published)",
                )
        axis.set_xlabel("arrived workload (% of cluster GPU capacity)")
        axis.set_ylabel(label)
        axis.grid(alpha=0.3)
    allocation_axis = axes[0]
    allocation_axis.set_xlim(80, 131)
    allocation_axis.set_ylim(84, 97)
    allocation_axis.set_title("allocation, zoom on 80-130% (full range in JSON)")
    axes[1].set_title("fragment amount")
    axes[2].set_title("fragmentation rate")
    axes[0].legend(fontsize=7, loc="lower right")
    figure.suptitle(
        f"Alibaba GPU trace v2023, variant '{variant}': median over seeds "
        "(solid: run here, dashed: FGD artifact)"
    )
    figure.tight_layout()
    path = out / f"placement_{variant}.png"
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def plot_unallocated(report: dict[str, Any], out: Path) -> Path:
    variants = list(report["variants"])
    policies = list(next(iter(report["variants"].values()))["ours"])
    figure, axis = plt.subplots(figsize=(max(8, 1.1 * len(variants) + 3), 5))
    width = 0.8 / (len(policies) + 1)
    for i, policy in enumerate([*policies, "fgd (published)"]):
        heights = []
        for variant in variants:
            data = report["variants"][variant]
            if policy == "fgd (published)":
                curve = data["published"].get("fgd", {}).get("allocation")
            else:
                curve = data["ours"][policy]["median"]["allocation"]
            heights.append(100.0 - curve[130] if curve and not math.isnan(curve[130]) else 0.0)
        colour = "black" if policy == "fgd (published)" else COLOURS.get(policy)
        axis.bar([v + i * width for v in range(len(variants))], heights, width, label=policy, color=colour)
    axis.set_xticks([v + 0.4 for v in range(len(variants))], variants, rotation=30, ha="right")
    axis.set_ylabel("unallocated GPUs at 130% arrived (% of all GPUs)")
    axis.set_title("Unallocated GPU capacity at 130% load (lower is better)")
    axis.legend(fontsize=8)
    axis.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    path = out / "placement_unallocated.png"
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def plot_report(report: dict[str, Any], out: Path) -> list[Path]:
    paths = [plot_variant(variant, data, out) for variant, data in report["variants"].items()]
    paths.append(plot_unallocated(report, out))
    return paths
