"""Checks between jobs on a simulated DGX H100: when an idle GPU is due (the pure schedule), that
the rounds check only GPUs nothing holds, at most K at once, and that a pod claiming a GPU mid-check
wins: the exerciser lets go of it before the claim returns."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hardware.simulated.backend import SimulatedBackend
from health.active_claims import CLAIMED_REASON
from health.active_schedule import GpuIdle, due, observe
from health.config import ActiveSettings, IdleSettings
from health.policy import DeviceState
from health.service import HealthService
from tests.support.waiting import wait_until
from tests.unit.test_health_active import Holds, backend, health, run_rounds, states, uuid
from tests.unit.test_health_monitor import FakeClock

__all__ = ["backend"]  # the fixture, imported

GPUS = [f"GPU-{i}" for i in range(4)]
HOURLY = IdleSettings(interval_s=3600, settle_s=60, max_gpus=2)


@pytest.mark.parametrize(
    ("seen", "checked", "settings", "wanted"),
    [
        # never checked, idle past the settle time: the first K in order
        ({g: GpuIdle(0.0) for g in GPUS}, {}, HOURLY, ["GPU-0", "GPU-1"]),
        # idle, but not yet for settle_s: none
        ({g: GpuIdle(950.0) for g in GPUS}, {}, HOURLY, []),
        # held by a pod (idle_since None): never
        ({"GPU-0": GpuIdle(None), "GPU-1": GpuIdle(0.0)}, {}, HOURLY, ["GPU-1"]),
        # checked 10 min ago: not due; one checked 2 h ago is
        (
            {g: GpuIdle(0.0) for g in GPUS},
            {"GPU-0": 400.0, "GPU-1": -6000.0, "GPU-2": 400.0, "GPU-3": 400.0},
            HOURLY,
            ["GPU-1"],
        ),
        # oldest check first
        (
            {g: GpuIdle(0.0) for g in GPUS},
            {"GPU-0": -5000.0, "GPU-1": -9000.0, "GPU-2": 400.0, "GPU-3": 400.0},
            HOURLY,
            ["GPU-1", "GPU-0"],
        ),
        # a job ended after the last check: due with after_job, not without
        ({"GPU-2": GpuIdle(100.0, 100.0)}, {"GPU-2": 50.0}, replace(HOURLY, after_job=True), ["GPU-2"]),
        ({"GPU-2": GpuIdle(100.0, 100.0)}, {"GPU-2": 50.0}, HOURLY, []),
        # after-job checks come before periodic ones
        (
            {"GPU-0": GpuIdle(0.0), "GPU-3": GpuIdle(100.0, 100.0)},
            {"GPU-3": 50.0},
            replace(HOURLY, after_job=True, max_gpus=1),
            ["GPU-3"],
        ),
        # interval 0 and no after_job: off
        ({g: GpuIdle(0.0) for g in GPUS}, {}, IdleSettings(interval_s=0), []),
    ],
)
def test_due(
    seen: dict[str, GpuIdle], checked: dict[str, float], settings: IdleSettings, wanted: list[str]
) -> None:
    got = due(seen, GPUS, healthy=set(GPUS) - {"GPU-9"}, last_checked=checked, now=1000.0, settings=settings)
    assert got == wanted


def test_only_healthy_gpus_are_due() -> None:
    seen = {g: GpuIdle(0.0) for g in GPUS}
    assert due(seen, GPUS, healthy={"GPU-3"}, last_checked={}, now=1000.0, settings=HOURLY) == ["GPU-3"]


def test_observe_notes_when_a_gpu_became_free_and_when_its_job_ended() -> None:
    first = observe({}, GPUS, held={"GPU-1"}, now=10.0)
    assert first["GPU-0"] == GpuIdle(10.0, None) and first["GPU-1"] == GpuIdle(None, None)
    second = observe(first, GPUS, held={"GPU-0"}, now=20.0)
    assert second["GPU-0"] == GpuIdle(None, None)  # taken by a pod
    assert second["GPU-1"] == GpuIdle(20.0, 20.0)  # its job ended
    assert second["GPU-2"] == GpuIdle(10.0, None)  # still idle since the first look
    assert observe(second, GPUS, held={"GPU-1"}, now=30.0)["GPU-1"] == GpuIdle(None, 20.0)


class Pods:
    """The devices pods hold, as the kubelet's pod-resources API would list them."""

    def __init__(self) -> None:
        self.held: set[str] = set()
        self.blind = False

    def __call__(self) -> frozenset[str]:
        if self.blind:
            raise OSError("pod-resources socket gone")
        return frozenset(self.held)


def between_jobs(
    backend: SimulatedBackend, tmp_path: Path, idle: IdleSettings
) -> tuple[HealthService, FakeClock, Pods, Holds]:
    clock, pods = FakeClock(), Pods()
    service, _, holds = health(backend, tmp_path, clock=clock, burn_in_level=0, recheck_interval_s=0)
    busy = lambda u: "a pod holds it" if u in pods() else None  # noqa: E731
    service.parts = replace(service.parts, busy=busy, held=pods)
    service.parts = replace(
        service.parts,
        settings=replace(service.parts.settings, active=ActiveSettings(burn_in_level=0, idle=idle)),
    )
    service.active = service._active_runner()
    assert service.idle is not None
    service.idle.runner, service.idle.settings, service.idle.held = service.active, idle, pods
    service._load_bad_list()
    return service, clock, pods, holds


def wait_idle_run(service: HealthService) -> None:
    assert service.active is not None
    wait_until("the check to end", lambda: not service.active.running, timeout=20)  # type: ignore[union-attr]


def test_rounds_check_idle_gpus_k_at_a_time_and_never_one_a_pod_holds(
    backend: SimulatedBackend, tmp_path: Path
) -> None:
    service, clock, pods, holds = between_jobs(backend, tmp_path, HOURLY)
    pods.held = {uuid(backend, 4)}
    run_rounds(service, 1)  # first look: the free GPUs are idle from now on
    clock.now += 30
    run_rounds(service, 1)
    assert service.active is not None and not service.active.runs.last_json()  # not settled yet
    checked: list[set[int]] = []
    for _ in range(6):
        clock.now += 31
        run_rounds(service, 1)
        wait_idle_run(service)
        last = service.active.runs.last_json()
        if last is not None and (not checked or last["run"] > len(checked)):
            checked.append({g["index"] for g in last["gpus"].values() if g["verdict"] == "passed"})
    assert checked[:4] == [{0, 1}, {2, 3}, {5, 6}, {7}]
    assert all(len(call) <= 2 and uuid(backend, 4) not in call for call in holds.calls)
    assert last is not None and last["trigger"] == "idle"
    assert set(states(service).values()) == {DeviceState.HEALTHY}


def test_a_gpu_freed_by_a_job_is_checked_after_it_when_configured(
    backend: SimulatedBackend, tmp_path: Path
) -> None:
    service, clock, pods, _ = between_jobs(
        backend, tmp_path, IdleSettings(interval_s=0, after_job=True, settle_s=10, max_gpus=1)
    )
    backend.node.exerciser.add_bad_cell(5, 0x200)  # went bad under the job
    pods.held = {uuid(backend, 5)}
    run_rounds(service, 1)
    clock.now += 100
    run_rounds(service, 1)
    assert service.active is not None and service.active.runs.last_json() is None  # no job ended yet
    pods.held = set()
    run_rounds(service, 1)  # seen free: its job ended now
    clock.now += 11
    run_rounds(service, 1)
    wait_idle_run(service)
    last = service.active.runs.last_json()
    assert last is not None and list(last["gpus"]) == [uuid(backend, 5)]
    assert "hard memory failure" in last["gpus"][uuid(backend, 5)]["reasons"][0]
    run_rounds(service, 2)  # remediation: a hard memory failure goes straight to the bad-hardware list
    assert states(service)[uuid(backend, 5)] is DeviceState.RETIRED


def test_nothing_is_checked_while_the_agent_cannot_tell_who_holds_what(
    backend: SimulatedBackend, tmp_path: Path
) -> None:
    service, clock, pods, holds = between_jobs(backend, tmp_path, replace(HOURLY, settle_s=0))
    pods.blind = True
    for _ in range(3):
        clock.now += 4000
        run_rounds(service, 1)
    assert service.active is not None and service.active.runs.last_json() is None
    assert holds.calls == []


def activity(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_pod_claiming_a_gpu_mid_check_wins_and_the_check_lets_go_first(
    backend: SimulatedBackend, tmp_path: Path
) -> None:
    service, _, holds = health(backend, tmp_path, deadline_s=60)
    service._load_bad_list()
    log = tmp_path / "activity.jsonl"
    backend.node.exerciser.activity_file = log
    backend.node.exerciser.hang(600, 2)  # GPU 2's checks run (hang) until something stops them
    runner = service.active
    assert runner is not None
    outcome: list[object] = []
    thread = threading.Thread(target=lambda: outcome.append(runner.run([2, 3], level=1)), daemon=True)
    thread.start()
    wait_until("GPU 2's check to begin", lambda: any(e["gpu"] == 2 and e["begun"] for e in activity(log)))
    assert holds.calls[-1].keys() == {uuid(backend, 2), uuid(backend, 3)}  # withheld while exercised
    started = time.monotonic()
    runner.claims.claim({uuid(backend, 2)})  # what the agent's Allocate does for the pod's GPU
    claimed_at = time.monotonic()
    assert claimed_at - started < 5  # not the 600 s hang, nor the 60 s deadline
    ends = [e for e in activity(log) if e["gpu"] == 2 and not e["begun"]]
    assert ends and float(ends[-1]["at"]) <= claimed_at  # the exerciser let go before the pod got it
    assert uuid(backend, 2) not in holds.calls[-1]  # and its hold is lifted
    thread.join(10)
    (done,) = outcome
    gpus = done.gpus  # type: ignore[attr-defined]
    assert gpus[uuid(backend, 2)].verdict == "skipped" and gpus[uuid(backend, 2)].reasons == (CLAIMED_REASON,)
    assert gpus[uuid(backend, 3)].verdict in ("passed", "incomplete")  # never "failed": nothing hung
    run_rounds(service, 1)
    assert states(service)[uuid(backend, 2)] is DeviceState.HEALTHY
