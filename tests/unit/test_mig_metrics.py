"""MIG reshapes on the agent's /metrics: counted by outcome where a layout is applied to one GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import generate_latest

from hardware.profiles import load_profile
from hardware.simulated.lib import SimulatedNvmlLib
from hardware.simulated.node import SimulatedNode
from mig.metrics import MigMetrics
from mig.planner import MigPlanError, TargetEntry
from tests.support.sim_mig import mig_reconciler


class StepClock:
    """Each reading is 2 s after the previous one."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        self.now += 2.0
        return self.now


def _sample(metrics: MigMetrics, line_start: str) -> float:
    for line in generate_latest(metrics.registry).decode().splitlines():
        if line.startswith(line_start + " "):
            return float(line.split()[-1])
    return 0.0


def test_changed_unchanged_and_refused_applies_are_counted(tmp_path: Path) -> None:
    inventory = load_profile("dgx-h100").to_inventory()
    lib = SimulatedNvmlLib(SimulatedNode(inventory))
    lib.nvmlInit()
    metrics = MigMetrics()
    reconciler = mig_reconciler(lib, inventory, tmp_path, clock=StepClock(), metrics=metrics)

    two = [TargetEntry("3g.40gb"), TargetEntry("3g.40gb")]
    created = reconciler.apply(3, two).created
    assert not reconciler.apply(3, two).changed  # already the target: not a reshape
    assert lib.mig_node is not None
    lib.mig_node.gpus[3].set_busy(created[0].mig_uuid)
    with pytest.raises(MigPlanError):
        reconciler.apply(3, [TargetEntry("7g.80gb")])  # the busy 3g.40gb is in the way

    assert _sample(metrics, 'gpuweave_mig_reshapes_total{outcome="changed"}') == 1.0
    assert _sample(metrics, 'gpuweave_mig_reshapes_total{outcome="refused"}') == 1.0
    assert _sample(metrics, 'gpuweave_mig_reshapes_total{outcome="error"}') == 0.0
    assert _sample(metrics, "gpuweave_mig_reshape_seconds_count") == 1.0
    assert _sample(metrics, "gpuweave_mig_reshape_seconds_sum") > 0.0
