"""MIG on demand for DRA claims: only the claim's placement is added or removed, MIG off when the
last goes, and a claim whose instances were being made when the agent stopped leaves nothing."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from dradriver.claim_cdi import ClaimSpecWriter
from dradriver.devices import DraDevice, MigPublishing, dra_devices
from dradriver.mig_demand import MigOnDemand
from dradriver.prepare import CHECKPOINT_FILE, ClaimError, ClaimPreparer, ClaimRef
from hardware.device_nodes import HostDeviceNodes
from mig.planner import Instance, TargetEntry
from tests.support.small_inventory import small_inventory


@dataclass
class Reshaper:
    """The reconciler's current/apply over an in-memory layout (what NVML would show)."""

    layout: dict[int, list[Instance]] = field(default_factory=dict)
    applied: list[tuple[int, list[TargetEntry] | None]] = field(default_factory=list)
    fail: bool = False

    def current(self, index: int) -> tuple[Instance, ...]:
        return tuple(self.layout.get(index, []))

    def apply(self, index: int, target: Sequence[TargetEntry] | None) -> Any:
        if self.fail:
            raise RuntimeError("NVML said no")
        self.applied.append((index, None if target is None else list(target)))
        self.layout[index] = [Instance(t.profile, t.start or 0, 4) for t in target or []]


def test_create_adds_only_the_placement_and_destroy_removes_only_it() -> None:
    reshaper = Reshaper({0: [Instance("3g.40gb", 0, 4, busy=True)]})
    refreshed: list[int] = []
    demand = MigOnDemand(reshaper, refresh=lambda: refreshed.append(1))
    assert demand.create(0, "3g.40gb", 4) is True
    assert reshaper.applied[-1] == (0, [TargetEntry("3g.40gb", 0), TargetEntry("3g.40gb", 4)])
    assert demand.create(0, "3g.40gb", 4) is False  # exists: nothing applied
    assert demand.destroy(0, "3g.40gb", 4) is True
    assert reshaper.applied[-1] == (0, [TargetEntry("3g.40gb", 0)])  # the busy one kept
    assert demand.destroy(0, "3g.40gb", 0) is True
    assert reshaper.applied[-1] == (0, None)  # the last one: MIG off
    assert demand.destroy(0, "3g.40gb", 0) is False and len(refreshed) == 3


class Claims:
    def get_claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        result = {
            "request": "mig",
            "driver": "gpuweave.io",
            "pool": "node-a",
            "device": "gpu-2-mig-3g-40gb-4",
        }
        return {"metadata": {"uid": "u1"}, "status": {"allocation": {"devices": {"results": [result]}}}}


def _preparer(tmp_path: Path, reshaper: Reshaper) -> ClaimPreparer:
    inventory = small_inventory()

    def devices() -> tuple[Any, tuple[DraDevice, ...]]:
        return inventory, dra_devices(inventory, mig=MigPublishing.DYNAMIC)

    return ClaimPreparer(
        pool="node-a",
        state_dir=tmp_path,
        source=Claims(),
        devices=devices,
        specs=ClaimSpecWriter(tmp_path / "cdi"),
        host=HostDeviceNodes,
        mig=MigOnDemand(reshaper, refresh=lambda: None),
    )


def test_a_failed_reshape_fails_the_claim_and_leaves_no_checkpoint_entry(tmp_path: Path) -> None:
    preparer = _preparer(tmp_path, Reshaper(fail=True))
    with pytest.raises(ClaimError, match="cannot make its MIG instance: NVML said no"):
        preparer.prepare(ClaimRef("u1", "ns", "c"))
    assert json.loads((tmp_path / CHECKPOINT_FILE).read_text())["claims"] == {}


def test_a_claim_pending_at_a_crash_has_its_instances_removed_at_start(tmp_path: Path) -> None:
    reshaper = Reshaper({2: [Instance("3g.40gb", 4, 4)]})
    pending = {"namespace": "ns", "name": "c", "pending": True, "mig": [[2, "3g.40gb", 4]]}
    (tmp_path / CHECKPOINT_FILE).write_text(json.dumps({"version": 1, "claims": {"u1": pending}}))
    preparer = _preparer(tmp_path, reshaper)
    assert reshaper.applied == [(2, None)] and preparer.prepared() == {}
