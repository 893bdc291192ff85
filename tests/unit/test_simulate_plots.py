"""policies.png reads on its own: every bar carries its value, and a panel where one bar dwarfs
another (gpuweave's 5 s gang recovery beside a baseline's 4,448 s) has a log axis."""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import pytest

from gpuweave.simulate.report import summary_figure, value_label

KEYS = (
    "gpu_allocation_pct",
    "fragmentation_pct",
    "topology_best_set_pct",
    "pending_mean_min",
    "job_completion_mean_min",
    "job_completion_p95_min",
    "gpu_hours_lost_to_faults",
    "gang_recovery_median_s",
)


def _summary(policy: str, **values: Any) -> dict[str, Any]:
    base = {"gpu_allocation_pct": 69.4, "fragmentation_pct": 2.7, "topology_best_set_pct": 91.0,
            "pending_mean_min": 3.3, "job_completion_mean_min": 47.4, "job_completion_p95_min": 123.0,
            "gpu_hours_lost_to_faults": 1.2, "gang_recovery_median_s": 5.0}
    return {"policy": policy, **base, **values}


def _panels(summaries: list[dict[str, Any]]) -> dict[str, tuple[str, list[str]]]:
    """Panel title -> (its y scale, the labels over its bars)."""
    figure = summary_figure(summaries)
    try:
        return {
            axis.get_title(): (axis.get_yscale(), [t.get_text() for t in axis.texts])
            for axis in figure.axes
        }
    finally:
        plt.close(figure)


def test_every_bar_is_labelled_and_a_dwarfed_bar_gets_a_log_axis() -> None:
    summaries = [
        _summary("gpuweave"),
        _summary("random", gang_recovery_median_s=2468.0, gpu_hours_lost_to_faults=0.0),
        _summary("best-fit", gang_recovery_median_s=4448.0),
        _summary("go-gpuallocator-like", gang_recovery_median_s=None),
    ]
    panels = _panels(summaries)
    assert panels["median gang recovery (s) (log scale)"] == ("log", ["5", "2,468", "4,448", "n/a"])
    assert panels["GPU allocation %"] == ("linear", ["69.4"] * 4)
    assert panels["GPU-hours lost to faults"] == ("linear", ["1.2", "0", "1.2", "1.2"])
    assert all(len(labels) == len(summaries) for _, labels in panels.values())


@pytest.mark.parametrize(
    ("value", "shown"), [(4448.0, "4,448"), (69.44, "69.4"), (1.2174, "1.22"), (0.0, "0"), (None, "n/a")]
)
def test_a_value_is_shown_with_the_digits_it_needs(value: float | None, shown: str) -> None:
    assert value_label(value) == shown
