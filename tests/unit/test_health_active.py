"""Active checks through the health service on a simulated DGX H100: burn-in, on-demand runs,
re-checks, hangs, and what reaches the engine, the startup taint and the bad-hardware list."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path

import pytest

from devicemodel.errors import InvalidInputError
from devicemodel.inventory import DegradedLink
from hardware.exerciser.protocol import ExercisePlan, ExerciseReport
from hardware.health_probe import GpuReadings, NvmlHealthProbe
from hardware.profiles import load_profile
from hardware.simulated.backend import SimulatedBackend
from hardware.simulated.exerciser import SimulatedExerciser
from health.active import Thresholds, judge_deltas
from health.active_io import deltas
from health.active_runner import ActiveCheckRunner, ActiveParts
from health.config import ActiveSettings, HealthSettings
from health.errors import ActiveCheckBusyError, HealthStateError
from health.links_file import DEGRADED_LINKS_FILE, DegradedLinkFile
from health.policy import DeviceState
from health.scope import TAINT_HEALTH_PENDING
from health.service import HealthParts, HealthService
from health.xid import Severity
from tests.support.waiting import wait_until
from tests.unit.test_health_monitor import FakeClock, Sink
from tests.unit.test_health_remediation import RecordingCluster

ROUNDS = HealthSettings(round_interval_s=0.05, check_timeout_s=0.5)  # probation: 2 clean rounds


class Holds:
    """The agent's gate as health sees it: every map of GPUs withheld for a run, in order."""

    def __init__(self) -> None:
        self.calls: list[dict[str, str]] = []

    def __call__(self, reasons: Mapping[str, str]) -> None:
        self.calls.append(dict(reasons))


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[SimulatedBackend]:
    sim = SimulatedBackend(load_profile("dgx-h100"), tmp_path / "sysfs", kmsg_path=tmp_path / "kmsg")
    sim.discover()  # NVML initialised, as the agent's discovery leaves it
    yield sim
    sim.close()


def health(
    backend: SimulatedBackend,
    tmp_path: Path,
    *,
    clock: FakeClock | None = None,
    links: Callable[[tuple[DegradedLink, ...]], None] | None = None,
    **active: object,
) -> tuple[HealthService, RecordingCluster, Holds]:
    node = backend.node
    probe = NvmlHealthProbe(
        backend.lib,
        sysfs_root=backend.sysfs_root / "sys",
        reset=node.health.reset_uuid,
        proc_root=backend.sysfs_root / "proc",
    )
    cluster, holds = RecordingCluster([]), Holds()
    settings = replace(ROUNDS, active=ActiveSettings(**active))
    parts = HealthParts(
        inventory=backend.inventory,
        probe=probe,
        device_ops=probe,
        sink=Sink(),
        state_dir=tmp_path / "state",
        settings=settings,
        node_name="node-a",
        cluster=cluster,
        exerciser=SimulatedExerciser(node.inventory, node.health, node.exerciser),
        hold=holds,
        links=links,
        **({"clock": clock} if clock is not None else {}),
    )
    return HealthService(parts), cluster, holds


def uuid(backend: SimulatedBackend, index: int) -> str:
    return backend.inventory.gpu(index).uuid


def states(service: HealthService) -> dict[str, DeviceState]:
    return {u: r.state for u, r in service.snapshot().gpus.items()}


def test_burn_in_withholds_only_the_bad_gpus_and_the_startup_taint_lifts_for_the_rest(
    backend: SimulatedBackend, tmp_path: Path
) -> None:
    backend.node.exerciser.add_bad_cell(3, 0x100000)  # a stuck cell 1 MiB in
    backend.node.exerciser.hang(600, 5)  # every active check on GPU 5 hangs far past the deadline
    service, cluster, holds = health(backend, tmp_path, deadline_s=1.0, recheck_interval_s=0)
    service.start()
    try:
        wait_until(
            "the startup taint to lift", lambda: TAINT_HEALTH_PENDING not in cluster.taints, timeout=30
        )
        wait_until("GPU 3 retired", lambda: states(service)[uuid(backend, 3)] is DeviceState.RETIRED)
        now = states(service)
        assert now[uuid(backend, 5)] in (DeviceState.FAILED, DeviceState.REMEDIATING, DeviceState.PROBATION)
        assert {u for u, s in now.items() if s is DeviceState.HEALTHY} == {
            uuid(backend, i) for i in (0, 1, 2, 4, 6, 7)
        }
        assert uuid(backend, 3) in cluster.bad  # the bad-hardware list, in the cluster too
        assert "hard memory failure" in cluster.bad[uuid(backend, 3)].reason
        assert "active-check: memory pattern" in service.snapshot().gpus[uuid(backend, 3)].reason
        assert service.engine.rechecks.keys() == {uuid(backend, 3), uuid(backend, 5)}
        assert all(call == {} for call in holds.calls)  # the startup taint, not a hold, covers the burn-in
        assert ("GpuweaveActiveCheckFailed", "node") in cluster.events
    finally:
        service.stop()


def test_without_burn_in_the_taint_lifts_after_the_rounds_alone(
    backend: SimulatedBackend, tmp_path: Path
) -> None:
    backend.node.exerciser.add_bad_cell(3, 0)
    service, cluster, _ = health(backend, tmp_path, burn_in_level=0)
    service.start()
    try:
        wait_until(
            "the startup taint to lift", lambda: TAINT_HEALTH_PENDING not in cluster.taints, timeout=30
        )
        assert set(states(service).values()) == {DeviceState.HEALTHY}
    finally:
        service.stop()


def run_rounds(service: HealthService, count: int) -> None:
    for _ in range(count):
        service.monitor.run_round()


def test_a_slow_nvlink_pair_is_a_degraded_link_both_gpus_pass_until_it_is_measured_at_its_rate(
    backend: SimulatedBackend, tmp_path: Path
) -> None:
    published: list[tuple[DegradedLink, ...]] = []
    service, cluster, _ = health(backend, tmp_path, links=published.append, recheck_interval_s=0)
    service.start_links()
    assert published == [()]
    backend.node.exerciser.slow_pair(1, 2)
    runner = service.active
    assert runner is not None
    outcome = runner.run(None, level=1)
    assert {g.verdict for g in outcome.gpus.values()} == {"passed"}  # the link is slow, not the GPUs
    (link,) = published[-1]
    assert (link.gpu_a, link.gpu_b, link.fraction) == (1, 2, 0.425)
    assert "below 55% of its 18 lanes' 450.0 GB/s" in link.reason
    assert any(reason == "GpuweaveNvlinkDegraded" for reason, _ in cluster.events)
    metric = service.metrics.registry.get_sample_value
    assert metric("gpuweave_health_active_gpus_total", {"trigger": "on-demand", "verdict": "passed"}) == 8
    assert metric("gpuweave_health_active_checks_total", {"check": "p2p", "status": "done"}) == 8
    slow = {"device": uuid(backend, 1), "check": "p2p", "peer": uuid(backend, 2)}
    assert metric("gpuweave_health_active_bandwidth_gbps", slow) == pytest.approx(191.25)
    run_rounds(service, 2)
    assert set(states(service).values()) == {DeviceState.HEALTHY}  # nothing withheld
    # persisted: a restarted agent publishes it again before any check
    again: list[tuple[DegradedLink, ...]] = []
    restarted, _, _ = health(backend, tmp_path, links=again.append)
    restarted.start_links()
    assert [(x.gpu_a, x.gpu_b) for x in again[-1]] == [(1, 2)]
    backend.node.exerciser.clear()
    runner.run([1, 2], level=1)
    assert published[-1] == ()  # measured at its rate: cleared
    assert DegradedLinkFile(tmp_path / "state").load() == {}


def test_a_broken_degraded_links_file_stops_the_start(backend: SimulatedBackend, tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / DEGRADED_LINKS_FILE).write_text('[{"gpus": ["GPU-a"], "fraction": 0.5}]')
    with pytest.raises(HealthStateError, match="not a degraded-link record"):
        health(backend, tmp_path)


def test_a_narrow_pcie_link_and_a_slow_compute_are_found(backend: SimulatedBackend, tmp_path: Path) -> None:
    service, _, _ = health(backend, tmp_path, compute_slack=1.05)
    backend.node.health.set_pcie_width(6, 8)
    assert service.active is not None
    outcome = service.active.run([6, 7], level=1)
    reasons = outcome.gpus[uuid(backend, 6)].reasons
    assert any(
        "host-to-device copies at 26.8 GB/s, below 55% of the PCIe gen5 x16 link's 63.0 GB/s" in r
        for r in reasons
    )
    assert outcome.gpus[uuid(backend, 7)].verdict == "failed"  # 90 % of the model's rate is past 1/1.05
    assert "compute kernel took" in outcome.gpus[uuid(backend, 7)].reasons[0]


def test_gpus_a_pod_or_a_process_holds_are_left_alone(backend: SimulatedBackend, tmp_path: Path) -> None:
    service, _, holds = health(backend, tmp_path)
    service.parts = replace(service.parts, busy=lambda u: "a pod holds it" if u == uuid(backend, 0) else None)
    service.active = service._active_runner()
    backend.node.health.set_processes(1, (4242,))
    backend.node.exerciser.add_bad_cell(1, 0)
    outcome = service.active.run(None, level=1)
    assert outcome.gpus[uuid(backend, 0)].verdict == "skipped"
    assert outcome.gpus[uuid(backend, 1)].reasons == ("compute processes run on it",)
    assert len(outcome.gpus) == 8
    assert set(holds.calls[1]) == {uuid(backend, i) for i in range(2, 8)}  # held while they ran
    assert states(service)[uuid(backend, 1)] is DeviceState.HEALTHY


class NeverReturns:
    """A backend that ignores its deadline (a driver call that cannot be interrupted in-process)."""

    name = "stuck"

    def __init__(self) -> None:
        self.released = threading.Event()

    def run(
        self, plan: ExercisePlan, *, deadline_s: float, cancel: threading.Event | None = None
    ) -> ExerciseReport:
        self.released.wait(3600)
        return ExerciseReport(self.name, plan, (), 0.0)


def test_a_backend_that_never_returns_fails_its_gpus_closed_at_the_deadline(
    backend: SimulatedBackend, tmp_path: Path
) -> None:
    service, _, _ = health(backend, tmp_path, deadline_s=0.5)
    stuck = NeverReturns()
    parts = ActiveParts(
        exerciser=stuck,
        probe=service.parts.probe,
        settings=service.parts.settings.active,
        backstop_grace_s=0.5,
    )
    try:
        outcome = ActiveCheckRunner(service.monitor, parts).run([2, 3], level=1)
    finally:
        stuck.released.set()
    assert {g.verdict for g in outcome.gpus.values()} == {"failed"}
    assert "did not return within its 0.5 s deadline" in outcome.gpus[uuid(backend, 2)].reasons[0]
    assert states(service)[uuid(backend, 2)] is DeviceState.FAILED
    assert states(service)[uuid(backend, 4)] is DeviceState.HEALTHY


def test_one_run_at_a_time_and_bad_requests_are_refused_before_a_run(
    backend: SimulatedBackend, tmp_path: Path
) -> None:
    service, _, _ = health(backend, tmp_path)
    backend.node.exerciser.hang(600)
    runner = service.active
    assert runner is not None
    with pytest.raises(InvalidInputError, match="no GPU 9 on this node"):
        runner.start([9])
    with pytest.raises(InvalidInputError, match="level 7 does not exist"):
        runner.start(None, level=7)
    first = runner.start([0], level=1)
    assert first.state == "running"
    with pytest.raises(ActiveCheckBusyError, match=f"run {first.run}, on-demand, level 1"):
        runner.start([1])
    backend.node.exerciser.clear()
    backend.node.exerciser.cancel.set()


def test_a_withheld_gpu_is_rechecked_on_its_interval(backend: SimulatedBackend, tmp_path: Path) -> None:
    clock = FakeClock()
    service, _, _ = health(backend, tmp_path, clock=clock, recheck_interval_s=300)
    backend.node.health.set_pcie_width(4, 8)  # copies at half the link's rate: Suspect
    runner = service.active
    assert runner is not None
    assert runner.run([4, 5], level=1).gpus[uuid(backend, 4)].verdict == "failed"
    backend.node.health.set_pcie_width(4, 16)
    service.monitor.run_round()  # the first due re-check starts at once
    wait_until("the re-check", lambda: runner.runs.running() is None and service.engine.rechecks == {})
    assert runner.runs.last_json()["trigger"] == "recheck"  # type: ignore[index]
    run_rounds(service, 3)
    assert set(states(service).values()) == {DeviceState.HEALTHY}


def test_errors_the_exercise_provoked_are_findings(backend: SimulatedBackend, tmp_path: Path) -> None:
    before = {uuid(backend, 0): _readings(dbe=0, sbe=0), uuid(backend, 1): _readings(dbe=0, sbe=0)}
    after = {uuid(backend, 0): _readings(dbe=2, sbe=0), uuid(backend, 1): _readings(dbe=0, sbe=40, rows=3)}
    changed = deltas(before, after, {uuid(backend, 1): 1}, {uuid(backend, 1): 2})
    found = judge_deltas(changed, thresholds=Thresholds())
    assert [f.severity for f in found[uuid(backend, 0)]] == [Severity.FATAL]
    reasons = [f.reason for f in found[uuid(backend, 1)]]
    assert reasons == [
        "active-check: 1 Xid(s) while exercising the idle GPU",
        "active-check: 40 corrected ECC errors during the check",
        "active-check: 3 row(s) remapped during the check",
    ]


def _readings(*, dbe: int, sbe: int, rows: int = 0) -> GpuReadings:
    return GpuReadings(dbe, sbe, (rows, 0, False, False), None, (), 18, 40, (16, 16), (5, 5))
