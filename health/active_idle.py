"""Checks of idle GPUs between jobs: a round hook that starts a run when some GPU is due.

Every round it asks once which devices pods hold (``held``: the kubelet's pod-resources API and
the agent's own recent Allocate grants, in one call), records what it saw
(``health.active_schedule.observe``) and, when no run is going, starts one over the GPUs due
(``due``: Healthy, idle long enough, last checked long enough ago or freed by a job), at most
``idle.max_gpus`` at once, at ``idle.level``. The run itself is the runner's: it withholds the
GPUs, asks again whether a pod holds one (a pod admitted since this look wins), and lets go of
one a pod claims mid-run. Results go into the health engine as every run's do.

When the agent cannot tell which devices pods hold (no pod-resources API configured, or it does not
answer), no GPU is idle: nothing is checked until it can tell again.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from health.active_runner import ActiveCheckRunner, Held
from health.active_schedule import GpuIdle, due, observe
from health.config import IdleSettings
from health.errors import ActiveCheckBusyError
from health.monitor import HealthMonitor
from health.policy import DeviceState

log = logging.getLogger(__name__)
TRIGGER = "idle"


class IdleChecks:
    def __init__(self, runner: ActiveCheckRunner, settings: IdleSettings, held: Held | None) -> None:
        self.runner = runner
        self.settings = settings
        self.held = held
        self.seen: dict[str, GpuIdle] = {}
        self._blind = False  # the last look could not tell who holds what (logged once per spell)
        if settings.enabled and held is None:
            log.warning(
                "active checks between jobs are off: the agent cannot tell which GPUs pods hold "
                "(no kubelet pod-resources API)"
            )

    @property
    def enabled(self) -> bool:
        return self.settings.enabled and self.held is not None

    def __call__(self, monitor: HealthMonitor) -> None:
        if not self.enabled:
            return
        now = monitor.now()
        gpus = [g.uuid for g in monitor.engine.inventory.gpus]
        held = self._held_gpus(gpus)
        self.seen = observe(self.seen, gpus, held=held, now=now)
        if self.runner.running:
            return
        chosen = due(
            self.seen,
            gpus,
            healthy=self._healthy(monitor),
            last_checked=dict(self.runner.last_checked),
            now=now,
            settings=self.settings,
        )
        indexes = [i for i in (monitor.engine.gpu_index(u) for u in chosen) if i is not None]
        if indexes:
            with contextlib.suppress(ActiveCheckBusyError):  # a run began meanwhile: next round
                self.runner.start(
                    indexes, level=self.settings.level, trigger=TRIGGER, max_gpus=self.settings.max_gpus
                )

    def _held_gpus(self, gpus: list[str]) -> set[str]:
        """The GPUs pods hold; every GPU when that cannot be told (fail closed)."""
        assert self.held is not None
        try:
            held = set(self.held())
        except Exception as exc:
            if not self._blind:
                log.warning("active checks between jobs wait: which GPUs pods hold is unknown (%s)", exc)
            self._blind = True
            return set(gpus)
        self._blind = False
        return held

    @staticmethod
    def _healthy(monitor: HealthMonitor) -> set[str]:
        engine = monitor.engine
        mig = {g.uuid for g in engine.inventory.gpus if g.mig_enabled}
        with monitor.lock:
            return {
                uuid
                for uuid, record in engine.gpus.items()
                if record.state is DeviceState.HEALTHY and uuid not in engine.rechecks and uuid not in mig
            }

    def status(self) -> dict[str, Any]:
        return {
            "enabled": self.enabled,
            "intervalS": self.settings.interval_s,
            "afterJob": self.settings.after_job,
            "maxGpus": self.settings.max_gpus,
            "idle": sorted(u for u, s in self.seen.items() if s.idle_since is not None),
        }
