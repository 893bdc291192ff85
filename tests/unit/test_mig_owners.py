"""One owner per GPU: MIG reshapes and health remediations of a GPU never run at once or undo each other.

The reconciler runs over the simulated pynvml MIG surface; the test stands in for a health
remediation by holding the GPU's owner lock as a reset does.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from mig.planner import MigPlanError, TargetEntry
from mig.reconciler import MigReconciler
from tests.unit.test_mig_reconciler import layout, make

TWO_3G = [TargetEntry("3g.40gb"), TargetEntry("3g.40gb")]


def test_recreate_puts_back_the_same_layout_with_a_new_device(tmp_path: Path) -> None:
    lib, reconciler, _ = make("dgx-h100", tmp_path)
    first, second = reconciler.apply(3, TWO_3G).created
    result = reconciler.recreate(3, first.mig_uuid)
    assert result is not None
    assert layout(lib, 3) == [("3g.40gb", 0, 1), ("3g.40gb", 4, 1)]
    (recreated,) = result.created
    assert (recreated.start, recreated.size) == (0, 4) and recreated.mig_uuid != first.mig_uuid
    assert second.mig_uuid in devices(reconciler, 3)  # the other instance is left as it was


def devices(reconciler: MigReconciler, index: int) -> set[str]:
    return {c.mig_uuid for record in reconciler.snapshot(index).records for c in record.computes}


def test_recreate_never_reverts_a_layout_applied_after_the_fault(tmp_path: Path) -> None:
    lib, reconciler, _ = make("dgx-h100", tmp_path)
    failed = reconciler.apply(3, TWO_3G).created[0].mig_uuid  # an Xid hits this device, then ...
    reconciler.apply(3, [TargetEntry("7g.80gb")])  # ... the operator reshapes the GPU
    assert reconciler.recreate(3, failed) is None
    assert layout(lib, 3) == [("7g.80gb", 0, 1)]
    journal = reconciler._journal.load().gpus[reconciler.gpu(3).uuid]
    assert [(p.profile, p.start) for p in journal.target or ()] == [("7g.80gb", 0)]


def test_recreate_of_a_busy_instance_changes_nothing(tmp_path: Path) -> None:
    lib, reconciler, hooks = make("dgx-h100", tmp_path)
    busy = reconciler.apply(3, TWO_3G).created[0].mig_uuid
    hooks.busy.add(busy)
    with pytest.raises(MigPlanError):
        reconciler.recreate(3, busy)
    assert layout(lib, 3) == [("3g.40gb", 0, 1), ("3g.40gb", 4, 1)]


def test_a_reshape_waits_for_the_owner_of_its_gpu_and_other_gpus_go_on(tmp_path: Path) -> None:
    lib, reconciler, _ = make("dgx-h100", tmp_path)
    gpu3 = reconciler.gpu(3).uuid
    done: list[object] = []
    with reconciler.owners.hold(gpu3, who="health: GPU reset"):  # a reset of GPU 3 is running
        reshape = threading.Thread(target=lambda: done.append(reconciler.apply(3, TWO_3G)))
        reshape.start()
        reconciler.apply(4, [TargetEntry("7g.80gb")])  # another GPU is not held up
        assert layout(lib, 4) == [("7g.80gb", 0, 1)]
        assert layout(lib, 3) == [] and not done  # GPU 3 untouched while the reset owns it
        assert reconciler.owners.holder(gpu3) == "health: GPU reset"
    reshape.join(timeout=30)
    assert done and layout(lib, 3) == [("3g.40gb", 0, 1), ("3g.40gb", 4, 1)]
