"""The reconciler reshapes one GPU through the NVML surface, journals first, and converges after crashes."""

from __future__ import annotations

import functools
import json
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from devicemodel.inventory import NodeInventory
from hardware.mig_catalog import default_catalog
from hardware.mig_ops import MigInUseError, MigNvmlError, MigOps
from hardware.nvml_call import NvmlCaller
from hardware.profiles import load_profile
from hardware.simulated.lib import SimulatedNvmlLib
from hardware.simulated.node import SimulatedNode
from mig.journal import JOURNAL_FILE, MigJournal
from mig.planner import MigPlanError, PlannedInstance, TargetEntry
from mig.reconciler import GpuRef, MigApplyError, MigReconciler
from mig.restore import recover
from tests.support.sim_mig import mig_reconciler


def sim_lib(inventory: NodeInventory) -> SimulatedNvmlLib:
    lib = SimulatedNvmlLib(SimulatedNode(inventory))
    lib.nvmlInit()
    return lib


class RecordingHooks:
    def __init__(self) -> None:
        self.busy: set[str] = set()
        self.withheld: list[list[str]] = []
        self.changed_gpus: list[int] = []
        self.released: list[list[str]] = []

    def busy_devices(self) -> set[str]:
        return set(self.busy)

    def withhold(self, device_ids: Any) -> None:
        self.withheld.append(list(device_ids))

    def release(self, device_ids: Any) -> None:
        self.released.append(list(device_ids))

    def changed(self, gpu_index: int) -> None:
        self.changed_gpus.append(gpu_index)


@functools.cache
def inventory_of(profile: str) -> NodeInventory:
    return load_profile(profile).to_inventory()


def make(profile: str, tmp_path: Path, *, fault: Any = None, lib: SimulatedNvmlLib | None = None):
    inventory = inventory_of(profile)
    lib = lib or sim_lib(inventory)
    hooks = RecordingHooks()
    reconciler = mig_reconciler(lib, inventory, tmp_path, hooks=hooks, clock=lambda: 1000.0, fault=fault)
    return lib, reconciler, hooks


def layout(lib: SimulatedNvmlLib, index: int) -> list[tuple[str, int, int]]:
    assert lib.mig_node is not None
    gpu = lib.mig_node.gpus[index]
    if not gpu.mig_enabled:
        return []
    return sorted((gi.profile.name, gi.start, len(gi.computes)) for gi in gpu.gpu_instances())


def test_whole_to_two_3g_on_hopper_enables_mig_without_reset(tmp_path):
    lib, reconciler, hooks = make("dgx-h100", tmp_path)
    result = reconciler.apply(3, [TargetEntry("3g.40gb"), TargetEntry("3g.40gb")])
    assert result.mode_change == "enabled"
    assert [(c.profile, c.start, c.size) for c in result.created] == [("3g.40gb", 0, 4), ("3g.40gb", 4, 4)]
    assert all(c.mig_uuid.startswith("MIG-") for c in result.created)
    assert layout(lib, 3) == [("3g.40gb", 0, 1), ("3g.40gb", 4, 1)]
    assert lib.mig_node is not None and lib.mig_node.gpus[3].resets == 0
    assert hooks.withheld == [[reconciler.gpu(3).uuid]] and hooks.changed_gpus == [3]
    assert hooks.released == hooks.withheld
    assert all(layout(lib, i) == [] for i in range(8) if i != 3)


def test_reshape_keeps_busy_instance_and_withholds_only_the_destroyed(tmp_path):
    lib, reconciler, hooks = make("dgx-h100", tmp_path)
    first = reconciler.apply(3, [TargetEntry("3g.40gb"), TargetEntry("3g.40gb")])
    busy_uuid = first.created[0].mig_uuid
    hooks.busy.add(busy_uuid)
    result = reconciler.apply(3, [TargetEntry("3g.40gb")] + [TargetEntry("1g.10gb")] * 3)
    assert hooks.withheld[-1] == [first.created[1].mig_uuid]
    assert layout(lib, 3) == [("1g.10gb", 4, 1), ("1g.10gb", 5, 1), ("1g.10gb", 6, 1), ("3g.40gb", 0, 1)]
    assert len(result.destroyed) == 1 and "3g.40gb at 4:4" in result.destroyed[0]


def test_busy_instance_blocks_and_nothing_is_touched(tmp_path):
    lib, reconciler, hooks = make("dgx-h100", tmp_path)
    first = reconciler.apply(3, [TargetEntry("3g.40gb"), TargetEntry("3g.40gb")])
    hooks.busy.add(first.created[0].mig_uuid)
    with pytest.raises(MigPlanError, match=r"busy instance 3g.40gb at slots 0-3 blocks 7g.80gb"):
        reconciler.apply(3, [TargetEntry("7g.80gb")])
    assert layout(lib, 3) == [("3g.40gb", 0, 1), ("3g.40gb", 4, 1)]


def test_processes_nvml_reports_make_an_instance_busy(tmp_path):
    lib, reconciler, _ = make("dgx-h100", tmp_path)
    first = reconciler.apply(3, [TargetEntry("7g.80gb")])
    assert lib.mig_node is not None
    lib.mig_node.gpus[3].set_busy(first.created[0].mig_uuid)  # a process the agent did not know about
    with pytest.raises(MigPlanError, match=r"busy instance 7g.80gb at slots 0-7"):
        reconciler.apply(3, [TargetEntry("1g.10gb")])


def test_in_use_during_destroy_fails_releases_and_keeps_the_target(tmp_path):
    box: dict[str, Any] = {}

    def fault(point: str) -> None:
        if point.endswith("destroy:before") and "lib" in box:
            box["lib"].mig_node.gpus[3].set_busy(box["uuid"])  # a pod starts between plan and destroy

    lib, reconciler, hooks = make("dgx-h100", tmp_path, fault=fault)
    box["uuid"] = reconciler.apply(3, [TargetEntry("7g.80gb")]).created[0].mig_uuid
    box["lib"] = lib
    with pytest.raises(MigApplyError, match="in use"):
        reconciler.apply(3, [TargetEntry("1g.10gb")])
    assert hooks.released[-1] == [box["uuid"]]
    record = MigJournal(tmp_path).load().gpus[reconciler.gpu(3).uuid]
    assert record.in_flight and [p.profile for p in record.target or ()] == ["1g.10gb"]


def test_whole_gpu_process_blocks_enabling_mig(tmp_path):
    lib, reconciler, _ = make("dgx-h100", tmp_path)
    assert lib.mig_node is not None
    lib.mig_node.gpus[4].set_gpu_busy(True)
    with pytest.raises(MigPlanError, match="cannot enable MIG mode on GPU 4"):
        reconciler.apply(4, [TargetEntry("7g.80gb")])
    assert not lib.mig_node.gpus[4].mig_enabled


def test_ampere_mode_change_resets_only_that_gpu_and_needs_it_idle(tmp_path):
    lib, reconciler, hooks = make("dgx-a100", tmp_path)
    hooks.busy.add(reconciler.gpu(2).uuid)
    with pytest.raises(MigPlanError, match=r"cannot enable MIG mode on GPU 2 .*a pod holds the whole GPU"):
        reconciler.apply(2, [TargetEntry("3g.40gb")])
    hooks.busy.clear()
    reconciler.apply(2, [TargetEntry("3g.40gb")])
    assert lib.mig_node is not None
    assert [g.resets for g in lib.mig_node.gpus.values()] == [0, 0, 1, 0, 0, 0, 0, 0]
    assert layout(lib, 2) == [("3g.40gb", 4, 1)]


def test_back_to_whole_gpu_disables_mig(tmp_path):
    lib, reconciler, _ = make("dgx-h100", tmp_path)
    reconciler.apply(5, [TargetEntry("1g.10gb")] * 7)
    result = reconciler.apply(5, None)
    assert result.mode_change == "disabled" and len(result.destroyed) == 7
    assert lib.mig_node is not None and not lib.mig_node.gpus[5].mig_enabled


def test_journal_is_written_before_the_first_nvml_change(tmp_path):
    seen: list[dict[str, Any]] = []

    def fault(point: str) -> None:
        if point == "step-0:enable-mig:before":
            seen.append(json.loads((tmp_path / JOURNAL_FILE).read_text()))

    _, reconciler, _ = make("dgx-h100", tmp_path, fault=fault)
    reconciler.apply(1, [TargetEntry("2g.20gb")])
    gpu = seen[0]["gpus"][reconciler.gpu(1).uuid]
    assert [s["op"] for s in gpu["steps"]] == ["enable-mig", "create"] and gpu["next_step"] == 0


def test_hopper_layout_is_reapplied_after_a_driver_reload(tmp_path):
    lib, reconciler, _ = make("dgx-h100", tmp_path)
    reconciler.apply(3, [TargetEntry("3g.40gb"), TargetEntry("1g.10gb")])
    before = layout(lib, 3)
    assert lib.mig_node is not None
    lib.mig_node.driver_reload()
    assert not lib.mig_node.gpus[3].mig_enabled
    _, restarted, _ = make("dgx-h100", tmp_path, lib=lib)
    results = recover(restarted)
    assert [r.mode_change for r in results] == ["enabled"]
    assert layout(lib, 3) == before


class CrashError(Exception):
    pass


def crash_points(
    profile: str, tmp_path: Path, index: int, targets: list[list[TargetEntry] | None]
) -> list[str]:
    points: list[str] = []
    _, reconciler, _ = make(profile, tmp_path / "probe", fault=points.append)
    for target in targets:
        reconciler.apply(index, target)
    return points


SEQUENCES = [
    ("dgx-h100", [[TargetEntry("3g.40gb")] * 2, [TargetEntry("1g.10gb")] * 7, None]),
    (
        "dgx-a100",
        [[TargetEntry("3g.40gb"), TargetEntry("2g.20gb"), TargetEntry("1g.10gb")], [TargetEntry("7g.80gb")]],
    ),
]


@pytest.fixture
def fast_dir(tmp_path: Path) -> Iterator[Path]:
    """A state directory on tmpfs when there is one: the crash tables fsync the journal ~1000 times."""
    shm = Path("/dev/shm")
    if not shm.is_dir():
        yield tmp_path
        return
    with tempfile.TemporaryDirectory(dir=shm, prefix="gpuweave-mig-") as name:
        yield Path(name)


@pytest.mark.parametrize(("profile", "targets"), SEQUENCES, ids=[s[0] for s in SEQUENCES])
def test_crash_at_every_step_converges_on_restart(fast_dir, profile, targets):
    tmp_path = fast_dir
    points = crash_points(profile, tmp_path, 3, targets)
    assert any(":gi-created" in p for p in points) and len(points) > 10
    final = targets[-1]
    want = [] if final is None else sorted(e.profile for e in final)
    for crash_at, point in enumerate(points):
        state = tmp_path / f"crash-{crash_at}"

        def fault(seen: str, point: str = point) -> None:
            if seen == point:
                raise CrashError(seen)

        lib, reconciler, _ = make(profile, state, fault=fault)
        done = 0
        try:
            for target in targets:
                reconciler.apply(3, target)
                done += 1
        except CrashError:
            _, restarted, _ = make(profile, state, lib=lib)
            recover(restarted)  # a new agent converges the interrupted reshape from the journal
            for target in targets[done + 1 :]:
                restarted.apply(3, target)
        got = layout(lib, 3)
        assert sorted(p for p, _, _ in got) == want, f"crash at {point}"
        assert all(n == 1 for _, _, n in got), f"orphan GPU instance after crash at {point}"
        assert MigJournal(state).load().gpus[reconciler.gpu(3).uuid].in_flight is False


def test_through_the_backends_timeout_wrapper_in_use_keeps_its_code(tmp_path):
    inventory = inventory_of("dgx-h100")
    lib = sim_lib(inventory)
    caller = NvmlCaller(lib, timeout_s=5.0)
    try:
        assert lib.mig_node is not None
        ops = MigOps(lib, call=caller, resetter=lib.mig_node)
        reconciler = MigReconciler(
            ops=ops,
            journal=MigJournal(tmp_path),
            catalog=default_catalog(),
            gpus=[GpuRef(g.index, g.uuid, g.product) for g in inventory.gpus],
        )
        created = reconciler.apply(6, [TargetEntry("4g.40gb"), TargetEntry("3g.40gb")]).created
        assert [(c.profile, c.start) for c in created] == [("4g.40gb", 0), ("3g.40gb", 4)]
        lib.mig_node.gpus[6].set_busy(created[0].mig_uuid)
        gi_id = next(r.gi_id for r in ops.instances(6) if r.start == 0)
        with pytest.raises(MigInUseError) as caught:
            ops.destroy(6, gi_id=gi_id)
        assert caught.value.code == 19
    finally:
        caller.close()


def test_new_profile_at_a_destroyed_instances_placement(tmp_path):
    lib, reconciler, _ = make("dgx-a100", tmp_path)
    reconciler.apply(3, [TargetEntry("3g.40gb"), TargetEntry("3g.40gb")])
    result = reconciler.apply(3, [TargetEntry("4g.40gb"), TargetEntry("2g.20gb"), TargetEntry("1g.10gb")])
    assert [(c.profile, c.start) for c in result.created] == [("4g.40gb", 0), ("2g.20gb", 4), ("1g.10gb", 6)]
    assert layout(lib, 3) == [("1g.10gb", 6, 1), ("2g.20gb", 4, 1), ("4g.40gb", 0, 1)]


def test_recovery_skips_a_blocked_gpu_and_converges_the_others(tmp_path):
    lib, reconciler, _ = make("dgx-h100", tmp_path)
    first = reconciler.apply(1, [TargetEntry("7g.80gb")])
    reconciler.apply(2, [TargetEntry("3g.40gb")])
    journal = MigJournal(tmp_path)
    record = journal.load().gpus[reconciler.gpu(1).uuid]
    journal.record(replace(record, target=(PlannedInstance("1g.10gb", 0, 1),)))  # wanted, not reached
    assert lib.mig_node is not None
    lib.mig_node.gpus[1].set_busy(first.created[0].mig_uuid)
    lib.mig_node.gpus[2].driver_reload()
    _, restarted, _ = make("dgx-h100", tmp_path, lib=lib)
    results = recover(restarted)
    assert [r.gpu_index for r in results] == [2]
    assert layout(lib, 2) == [("3g.40gb", 4, 1)] and layout(lib, 1) == [("7g.80gb", 0, 1)]


def _creating_between_reads(reconciler: MigReconciler, creator: MigOps, *, times: int) -> Any:
    """A caller that creates a 1g instance on GPU 3 on the first GPU-instance listing of each of the
    first ``times`` reads, that is after the read took the MIG-device list: another actor's create
    racing a reader."""
    left = [times]
    one_g = reconciler.model(3).profile("1g.10gb")
    starts = iter((0, 1, 2, 3, 4, 5))  # the reconciler's own 1g sits at 6

    def call(name: str, thunk: Any) -> Any:
        if name == "nvmlDeviceGetMaxMigDeviceCount":
            left.append(1)  # a new read begins: arm one create
        elif name == "nvmlDeviceGetGpuInstances" and left[0] > 0 and len(left) > 1:
            left[0] -= 1
            del left[1:]
            creator.create(
                3,
                profile_id=one_g.profile_id,
                start=next(starts),
                size=one_g.memory_slices,
                ci_profile_index=one_g.ci_profile_index,
            )
        return thunk()

    return call


def test_an_instance_created_between_the_two_nvml_lists_is_read_again(tmp_path):
    lib, reconciler, _ = make("dgx-h100", tmp_path)
    reconciler.apply(3, [TargetEntry("1g.10gb")])  # MIG on, one instance (at placement 6)
    assert layout(lib, 3) == [("1g.10gb", 6, 1)]
    assert lib.mig_node is not None
    creator = MigOps(lib, resetter=lib.mig_node)
    reader = MigOps(lib, call=_creating_between_reads(reconciler, creator, times=1), resetter=lib.mig_node)
    records = reader.instances(3)
    assert len(records) == 2  # the first read saw the new CI without its MIG device; the second is whole
    assert {c.mig_uuid for r in records for c in r.computes} == set(creator.mig_uuids(3).values())


def test_a_gpu_that_keeps_changing_under_the_reader_fails_with_an_nvml_error(tmp_path):
    lib, reconciler, _ = make("dgx-h100", tmp_path)
    reconciler.apply(3, [TargetEntry("1g.10gb")])
    assert lib.mig_node is not None
    creator = MigOps(lib, resetter=lib.mig_node)
    reader = MigOps(lib, call=_creating_between_reads(reconciler, creator, times=10), resetter=lib.mig_node)
    with pytest.raises(MigNvmlError, match="has no MIG device among"):
        reader.instances(3)


def test_an_instance_destroyed_after_its_handle_was_listed_is_read_again(tmp_path):
    lib, reconciler, _ = make("dgx-h100", tmp_path)
    created = reconciler.apply(3, [TargetEntry("3g.40gb"), TargetEntry("3g.40gb")]).created
    assert lib.mig_node is not None
    other = MigOps(lib, resetter=lib.mig_node)
    gi_id = next(r.gi_id for r in other.instances(3) if r.computes[0].mig_uuid == created[1].mig_uuid)
    left = [1]

    def destroying(name: str, thunk: Any) -> Any:  # between the GPU-instance list and its info
        if name == "nvmlGpuInstanceGetInfo" and left[0]:
            left[0] -= 1
            other.destroy(3, gi_id=gi_id)
        return thunk()

    records = MigOps(lib, call=destroying, resetter=lib.mig_node).instances(3)
    assert [c.mig_uuid for r in records for c in r.computes] == [created[0].mig_uuid]


def test_a_mig_device_destroyed_while_busy_devices_reads_is_not_busy_and_the_others_still_are(tmp_path):
    lib, reconciler, _ = make("dgx-h100", tmp_path)
    created = reconciler.apply(3, [TargetEntry("3g.40gb"), TargetEntry("3g.40gb")]).created
    assert lib.mig_node is not None
    for instance in created:
        lib.mig_node.gpus[3].set_busy(instance.mig_uuid)
    other = MigOps(lib, resetter=lib.mig_node)
    doomed = next(r.gi_id for r in other.instances(3) if r.computes[0].mig_uuid == created[1].mig_uuid)
    calls = [0]

    def destroying(name: str, thunk: Any) -> Any:  # at the first MIG device's call (the GPU's is first)
        if name == "nvmlDeviceGetComputeRunningProcesses":
            calls[0] += 1
            if calls[0] == 2:
                lib.mig_node.gpus[3].set_busy(created[1].mig_uuid, False)
                other.destroy(3, gi_id=doomed)
        return thunk()

    busy = MigOps(lib, call=destroying, resetter=lib.mig_node).busy_devices(3)
    assert busy == {created[0].mig_uuid}
