"""MPS supervision's policy, driven step by step on in-memory daemons and a fake clock (pytest -k mps)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import pytest

from devicemodel.sharing import GpuSharing, MpsDefaults, SharingMode, SharingPlan
from deviceplugin.errors import AllocationRejectedError
from deviceplugin.mps import MpsSettings, MpsSupervisor, restart_delay, wanted_daemons
from hardware.mps import InMemoryMpsDaemons, MpsControlError, MpsDaemonSpec
from tests.support.small_inventory import gpu_uuid, small_inventory

FRACTIONAL = GpuSharing(SharingMode.FRACTIONAL, mps=MpsDefaults(thread_percentage=40, pinned_memory_mib=2048))


class FlakyDaemons(InMemoryMpsDaemons):
    """In-memory daemons whose starts fail for the GPUs in ``refuse``."""

    def __init__(self) -> None:
        super().__init__()
        self.refuse: set[str] = set()
        self.starts: list[str] = []

    def start(self, spec: MpsDaemonSpec) -> None:
        self.starts.append(spec.gpu_uuid)
        if spec.gpu_uuid in self.refuse:
            raise MpsControlError(f"GPU {spec.gpu_uuid}: start refused")
        super().start(spec)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


Parts = tuple[MpsSupervisor, FlakyDaemons, Clock, list[dict[str, str]]]


@pytest.fixture
def parts(tmp_path: Path) -> Parts:
    daemons, clock, gates = FlakyDaemons(), Clock(), list[dict[str, str]]()

    def gate(reasons: Mapping[str, str]) -> None:
        gates.append(dict(reasons))

    supervisor = MpsSupervisor(daemons, MpsSettings(base_dir=tmp_path), gate=gate, clock=clock)
    return supervisor, daemons, clock, gates


def _wanted(
    tmp_path: Path, *, fractional: tuple[int, ...] = (0, 1), mig_on: tuple[int, ...] = ()
) -> dict[str, MpsDaemonSpec]:
    plan = SharingPlan(per_gpu={str(i): FRACTIONAL for i in fractional})
    return wanted_daemons(small_inventory(mig_on=mig_on), plan, base_dir=tmp_path)


def test_mps_wanted_daemons_are_the_fractional_gpus_that_are_not_mig_or_retired(tmp_path: Path) -> None:
    wanted = _wanted(tmp_path, fractional=(0, 1, 2), mig_on=(2,))
    assert sorted(wanted) == [gpu_uuid(0), gpu_uuid(1)]
    spec = wanted[gpu_uuid(0)]
    assert spec.pipe_dir == tmp_path / gpu_uuid(0) / "pipe" and spec.log_dir == tmp_path / gpu_uuid(0) / "log"
    assert spec.setup_commands() == [
        "set_default_active_thread_percentage 40",
        "set_default_device_pinned_mem_limit 0 2048M",
    ]
    plan = SharingPlan(per_gpu={"0": FRACTIONAL, "1": FRACTIONAL})
    retired = wanted_daemons(small_inventory(), plan, base_dir=tmp_path, retired={gpu_uuid(1)})
    assert sorted(retired) == [gpu_uuid(0)]


def test_mps_restart_delay_is_immediate_then_doubles_to_the_cap() -> None:
    settings = MpsSettings(base_dir=Path("/x"), restart_base_s=1.0, restart_cap_s=5.0)
    assert [restart_delay(n, settings) for n in range(6)] == [0.0, 1.0, 2.0, 4.0, 5.0, 5.0]


def test_mps_dead_daemon_gates_only_its_gpu_and_is_restarted_in_the_same_pass(
    tmp_path: Path, parts: Parts
) -> None:
    supervisor, daemons, _, gates = parts
    wanted = _wanted(tmp_path)
    supervisor.check(wanted)
    assert gates[-1] == {}
    daemons.kill(wanted[gpu_uuid(0)])
    with pytest.raises(AllocationRejectedError, match="does not answer"):
        supervisor.pipe_directory(gpu_uuid(0))  # Allocate between rounds queries the daemon itself
    assert set(gates[-1]) == {gpu_uuid(0)}
    assert supervisor.pipe_directory(gpu_uuid(1)) == str(tmp_path / gpu_uuid(1) / "pipe")
    supervisor.check(wanted)
    assert gates[-1] == {} and supervisor.records()[gpu_uuid(0)].restarts == 1


def test_mps_failed_starts_back_off_and_fault_the_gpu_once(tmp_path: Path, parts: Parts) -> None:
    supervisor, daemons, clock, gates = parts
    wanted = _wanted(tmp_path)
    daemons.refuse.add(gpu_uuid(0))
    assert supervisor.check(wanted) == []  # failure 1: next try after 1 s
    assert supervisor.check(wanted) == []  # not due: no start
    assert daemons.starts.count(gpu_uuid(0)) == 1
    clock.now += 1.0
    assert supervisor.check(wanted) == []  # failure 2: next after 2 s
    clock.now += 2.0
    faulted = supervisor.check(wanted)  # failure 3: handed to health once
    assert [r.spec.gpu_uuid for r in faulted] == [gpu_uuid(0)]
    clock.now += 4.0
    assert supervisor.check(wanted) == []
    assert set(gates[-1]) == {gpu_uuid(0)} and "4 time(s)" in gates[-1][gpu_uuid(0)]
    with pytest.raises(AllocationRejectedError, match="no live MPS control daemon"):
        supervisor.pipe_directory(gpu_uuid(0))
    daemons.refuse.clear()
    clock.now += 8.0
    supervisor.check(wanted)
    assert gates[-1] == {} and not supervisor.records()[gpu_uuid(0)].faulted


def test_mps_gpu_leaving_fractional_mode_stops_its_daemon(tmp_path: Path, parts: Parts) -> None:
    supervisor, daemons, _, gates = parts
    wanted = _wanted(tmp_path)
    supervisor.check(wanted)
    supervisor.check(_wanted(tmp_path, fractional=(0,)))
    assert sorted(supervisor.records()) == [gpu_uuid(0)]
    with pytest.raises(MpsControlError):
        daemons.query(wanted[gpu_uuid(1)])
    changed = replace(wanted[gpu_uuid(0)], thread_percentage=10)  # new defaults: restarted with them
    supervisor.check({gpu_uuid(0): changed})
    assert supervisor.records()[gpu_uuid(0)].spec.thread_percentage == 10
    supervisor.stop_all()
    assert supervisor.records() == {} and gates[-1] == {}


def test_mps_uncreatable_pipe_directory_is_a_failed_start_not_a_crash(tmp_path: Path, parts: Parts) -> None:
    supervisor, _, _, gates = parts
    (tmp_path / "file").write_text("")
    plan = SharingPlan(per_gpu={"0": FRACTIONAL})
    wanted = wanted_daemons(small_inventory(), plan, base_dir=tmp_path / "file")
    supervisor.check(wanted)
    assert "cannot create the MPS directories" in gates[-1][gpu_uuid(0)]
    assert supervisor.records()[gpu_uuid(0)].failures == 1
