"""MPS supervision's policy, driven step by step on in-memory daemons and a fake clock (pytest -k mps)."""

from __future__ import annotations

import socket
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path

import pytest

from devicemodel.errors import InvalidInputError
from devicemodel.sharing import GpuSharing, MpsDefaults, SharingMode, SharingPlan
from hardware.mps import InMemoryMpsDaemons, MpsControlError, MpsDaemonQuitError, MpsDaemonSpec, OnExit
from nodeagent.errors import AllocationRejectedError
from nodeagent.mps import (
    CONTROL_SOCKET,
    SOCKET_PATH_MAX,
    MpsSettings,
    MpsSupervisor,
    check_pipe_paths,
    restart_delay,
    wanted_daemons,
)
from tests.support.agent_process import remove_tree, short_temp_dir
from tests.support.small_inventory import gpu_uuid, small_inventory
from tests.support.waiting import poll_until

FRACTIONAL = GpuSharing(SharingMode.FRACTIONAL, mps=MpsDefaults(thread_percentage=40, pinned_memory_mib=2048))


class FlakyDaemons(InMemoryMpsDaemons):
    """In-memory daemons whose starts fail for the GPUs in ``refuse``."""

    def __init__(self) -> None:
        super().__init__()
        self.refuse: set[str] = set()
        self.quit_at_start: set[str] = set()  # a tenant's quit lands in every start of these
        self.starts: list[str] = []

    def start(self, spec: MpsDaemonSpec, *, on_exit: OnExit | None = None) -> None:
        self.starts.append(spec.gpu_uuid)
        if spec.gpu_uuid in self.refuse:
            raise MpsControlError(f"GPU {spec.gpu_uuid}: start refused")
        if spec.gpu_uuid in self.quit_at_start:
            raise MpsDaemonQuitError(f"GPU {spec.gpu_uuid}: told to quit while it started")
        super().start(spec, on_exit=on_exit)


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

    settings = MpsSettings(base_dir=tmp_path, allocate_wait_s=2.0)  # waits on the fake clock end in 2 s
    supervisor = MpsSupervisor(daemons, settings, gate=gate, clock=clock)
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


def test_mps_daemon_that_exits_is_restarted_and_its_shares_are_never_withheld(
    tmp_path: Path, parts: Parts
) -> None:
    """A daemon that ran and exits (a tenant's ``quit``, a crash) is restarted; meanwhile its GPU's
    shares stay offered and an Allocate waits for the restart instead of being refused."""
    supervisor, daemons, clock, gates = parts
    wanted = _wanted(tmp_path)
    supervisor.check(wanted)
    assert gates[-1] == {}
    clock.now += 5.0  # longer than the restarts' spacing since the start: restarted at once
    daemons.kill(wanted[gpu_uuid(0)])  # its on_exit marks it restarting, no round needed
    record = supervisor.records()[gpu_uuid(0)]
    assert record.restarting and not record.up and not record.withheld
    assert supervisor.pipe_directory(gpu_uuid(0)) == str(tmp_path / gpu_uuid(0) / "pipe")  # restarts it
    assert supervisor.records()[gpu_uuid(0)].up and supervisor.records()[gpu_uuid(0)].restarts == 1
    assert all(reasons == {} for reasons in gates)
    assert daemons.starts == [gpu_uuid(0), gpu_uuid(1), gpu_uuid(0)]


def test_mps_restarts_of_one_gpu_are_spaced_and_an_allocate_waits_for_the_due_one(
    tmp_path: Path, parts: Parts
) -> None:
    """A tenant quitting in a loop costs the agent one restart per ``restart_spacing_s``: an exit
    within that time of the last start is restarted once the spacing has passed, not before."""
    supervisor, daemons, clock, gates = parts
    wanted = _wanted(tmp_path)
    supervisor.check(wanted)
    clock.now += 0.25
    daemons.kill(wanted[gpu_uuid(0)])
    assert supervisor.records()[gpu_uuid(0)].retry_at == 101.0  # started at 100.0, spacing 1 s
    supervisor.restart_due()
    assert daemons.starts.count(gpu_uuid(0)) == 1  # not due yet
    supervisor.check(wanted)  # nor in a round
    assert daemons.starts.count(gpu_uuid(0)) == 1
    clock.now = 101.0
    supervisor.restart_due()
    assert daemons.starts.count(gpu_uuid(0)) == 2 and supervisor.records()[gpu_uuid(0)].up
    assert all(reasons == {} for reasons in gates)


def test_mps_a_failed_restart_withholds_the_gpu_and_refuses_its_allocates(
    tmp_path: Path, parts: Parts
) -> None:
    supervisor, daemons, clock, gates = parts
    wanted = _wanted(tmp_path)
    supervisor.check(wanted)
    daemons.refuse.add(gpu_uuid(0))
    clock.now += 5.0
    daemons.kill(wanted[gpu_uuid(0)])
    with pytest.raises(AllocationRejectedError, match="failed to start 1 time"):
        supervisor.pipe_directory(gpu_uuid(0))
    assert set(gates[-1]) == {gpu_uuid(0)} and supervisor.records()[gpu_uuid(0)].withheld
    assert supervisor.pipe_directory(gpu_uuid(1)) == str(tmp_path / gpu_uuid(1) / "pipe")


def test_mps_exit_of_a_stopped_or_older_daemon_starts_nothing(tmp_path: Path, parts: Parts) -> None:
    supervisor, daemons, _, _ = parts
    wanted = _wanted(tmp_path)
    supervisor.check(wanted)
    run = supervisor.records()[gpu_uuid(0)].run
    supervisor.daemon_exited(gpu_uuid(0), run - 1)  # an earlier run's process
    assert supervisor.records()[gpu_uuid(0)].up
    supervisor.check(_wanted(tmp_path, fractional=(1,)))
    supervisor.daemon_exited(gpu_uuid(0), run)  # stopped: no record, nothing to restart
    assert gpu_uuid(0) not in supervisor.records() and daemons.starts.count(gpu_uuid(0)) == 1


def test_mps_restarter_thread_restarts_an_exited_daemon_without_a_round(tmp_path: Path) -> None:
    daemons = FlakyDaemons()
    settings = MpsSettings(base_dir=tmp_path, restart_spacing_s=0.0)
    supervisor = MpsSupervisor(daemons, settings, gate=lambda _: None)
    wanted = _wanted(tmp_path)
    supervisor.check(wanted)
    supervisor.start_restarter()
    try:
        daemons.kill(wanted[gpu_uuid(0)])
        assert poll_until(lambda: supervisor.records()[gpu_uuid(0)].up, timeout=10)
        assert supervisor.records()[gpu_uuid(0)].restarts == 1
    finally:
        supervisor.stop_all()
    assert supervisor.records() == {}


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


def test_mps_a_health_rounds_pass_leaves_the_starts_to_the_restarter(tmp_path: Path, parts: Parts) -> None:
    """A round never waits for a daemon's start: the restarter thread (``restart_due``) runs it."""
    supervisor, daemons, clock, gates = parts
    wanted = _wanted(tmp_path)
    supervisor.check(wanted)
    clock.now += 5.0
    daemons.kill(wanted[gpu_uuid(0)])
    assert supervisor.check(wanted, in_round=True) == []
    assert daemons.starts.count(gpu_uuid(0)) == 1 and gates[-1] == {}
    supervisor.restart_due()
    assert daemons.starts.count(gpu_uuid(0)) == 2 and supervisor.records()[gpu_uuid(0)].up


def test_mps_a_daemon_quit_at_every_start_is_withheld_once_an_allocate_would_stop_waiting(
    tmp_path: Path, parts: Parts
) -> None:
    """Starts cut short by a quit are not failed starts (no fault, no backoff), but a GPU whose
    daemon has been restarting for ``allocate_wait_s`` (2 s here) is withheld until it answers."""
    supervisor, daemons, clock, gates = parts
    wanted = _wanted(tmp_path)
    supervisor.check(wanted)
    clock.now += 5.0
    daemons.quit_at_start.add(gpu_uuid(0))
    daemons.kill(wanted[gpu_uuid(0)])
    for _ in range(3):
        clock.now += 1.0  # each start one spacing after the one before
        supervisor.restart_due()
    record = supervisor.records()[gpu_uuid(0)]
    assert record.restarting and record.failures == 0 and daemons.starts.count(gpu_uuid(0)) == 4
    assert set(gates[-1]) == {gpu_uuid(0)} and "down for 3 s" in gates[-1][gpu_uuid(0)]
    assert supervisor.check(wanted) == []  # no fault
    daemons.quit_at_start.clear()
    clock.now += 1.0
    supervisor.restart_due()
    assert gates[-1] == {} and supervisor.records()[gpu_uuid(0)].up


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = short_temp_dir()
    yield path
    remove_tree(path)


def test_mps_a_pipe_directory_too_long_for_a_unix_socket_is_one_clear_error(short_dir: Path) -> None:
    """The daemon's control socket must fit in sun_path: a longer base directory is refused at
    start, naming the path and what to change, instead of daemons that never answer."""
    tmp_path = short_dir
    suffix = len(f"/{gpu_uuid(0)}/pipe/{CONTROL_SOCKET}".encode())
    room = SOCKET_PATH_MAX - suffix - len(str(tmp_path).encode()) - 1
    assert room > 0
    fits = tmp_path / ("d" * room)
    check_pipe_paths(_wanted(fits))
    with pytest.raises(InvalidInputError, match=r"is 108 bytes long .* mpsPipeDirectory"):
        check_pipe_paths(_wanted(tmp_path / ("d" * (room + 1))))
    socket_path = fits / gpu_uuid(0) / "pipe" / CONTROL_SOCKET  # the limit is the kernel's
    socket_path.parent.mkdir(parents=True)
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(socket_path))
    longer = socket_path.with_name(CONTROL_SOCKET + "x")
    with socket.socket(socket.AF_UNIX) as sock, pytest.raises(OSError):
        sock.bind(str(longer))
