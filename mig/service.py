"""The MIG manager as the node agent runs it: control routes, start-up recovery, declared layouts.

The agent composes this (``mig/`` never imports the agent): ``AgentHooks`` adapts any object with
the agent's ``withhold`` / ``release`` / ``refresh_inventory`` methods to the reconciler's hooks,
and ``MigService.routes()`` gives the control-socket commands as plain ``params -> dict``
functions. Requests are validated here (pydantic, at the edge) and answered as JSON.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Collection, Iterable
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from devicemodel.contracts import MIG_LAYOUT_ANNOTATION
from devicemodel.errors import GpuweaveError, InvalidInputError
from devicemodel.validation import first_problem
from mig.demand import demand_covered
from mig.intent import GpuMigState, derive_demand_plans, mig_requests, parse_entry, parse_layout_annotation
from mig.planner import Plan, TargetEntry
from mig.reconciler import MigApplyError, MigReconciler, NoHooks, ReshapeResult
from mig.restore import Restorer, recover

LOG = logging.getLogger(__name__)
WITHHOLD_REASON = "MIG reshape: device about to be destroyed"
HeldByPods = Callable[[], Collection[str]]  # device IDs pods hold now; raises when it cannot tell


class AgentPort(Protocol):
    """The part of the node agent the MIG manager uses."""

    def withhold(self, device_ids: Iterable[str], reason: str = ...) -> None: ...

    def release(self, device_ids: Iterable[str]) -> None: ...

    def refresh_inventory(self) -> dict[str, int]: ...


class MigBusyUnknownError(MigApplyError):
    """Which devices pods hold could not be read: every device counts as busy, so nothing is reshaped."""


class AgentHooks:
    """Reconciler hooks backed by the agent; withholding and refreshes stay quiet until ``attach()``
    (recovery runs before serving), the busy check never does.

    ``held_by_pods`` returns the device IDs pods hold (the kubelet's pod-resources API and the
    agent's recent Allocate grants, composed by the node agent); the reconciler adds the devices
    NVML sees running processes on. When it raises, the hook fails closed: it raises
    ``MigBusyUnknownError`` and the apply (or plan, or status) stops before any NVML change, since
    "could not ask" must never read as "nothing in use".
    """

    def __init__(self, agent: AgentPort, *, held_by_pods: HeldByPods | None = None) -> None:
        self._agent = agent
        self._held_by_pods = held_by_pods
        self._live = False

    def attach(self) -> None:
        self._live = True

    def busy_devices(self) -> Collection[str]:
        if self._held_by_pods is None:
            return ()  # NVML's running processes only; the reconciler asks NVML itself
        try:
            return self._held_by_pods()
        except Exception as exc:
            LOG.warning("MIG busy check failed closed: %s", exc)
            raise MigBusyUnknownError(
                f"cannot tell which MIG devices pods hold ({exc}); treating every device as busy, "
                "so no MIG reshape runs until this reads again"
            ) from exc

    def withhold(self, device_ids: Collection[str]) -> None:
        if self._live and device_ids:
            self._agent.withhold(device_ids, WITHHOLD_REASON)

    def release(self, device_ids: Collection[str]) -> None:
        if self._live and device_ids:
            self._agent.release(device_ids)

    def changed(self, gpu_index: int) -> None:
        if self._live:
            self._agent.refresh_inventory()


class ApplyRequest(BaseModel):
    """``mig.apply`` / ``mig.plan`` params: a GPU and its target (profiles, or whole GPU)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    gpu: int = Field(ge=0)
    profiles: list[str] | None = None
    whole: bool = False

    @model_validator(mode="after")
    def _one_target(self) -> ApplyRequest:
        if (self.profiles is None) == (not self.whole):
            raise ValueError('give either "profiles" (a list, may be empty) or "whole": true')
        return self

    def target(self) -> list[TargetEntry] | None:
        return None if self.whole else [parse_entry(p) for p in self.profiles or ()]


def _request(params: dict[str, Any]) -> ApplyRequest:
    try:
        return ApplyRequest.model_validate(params)
    except ValidationError as exc:
        where, problem = first_problem(exc, whole="params")
        raise InvalidInputError(f"bad MIG request at {where}: {problem}") from exc


def result_json(result: ReshapeResult) -> dict[str, Any]:
    return {
        "gpu": result.gpu_index,
        "gpuUuid": result.gpu_uuid,
        "changed": result.changed,
        "modeChange": result.mode_change,
        "destroyed": list(result.destroyed),
        "created": [
            {"profile": c.profile, "start": c.start, "size": c.size, "uuid": c.mig_uuid}
            for c in result.created
        ],
        "final": [{"profile": p.profile, "start": p.start, "size": p.size} for p in result.final],
    }


def plan_json(plan: Plan, *, gpu: int) -> dict[str, Any]:
    def placed(profile: str, start: int, size: int) -> dict[str, Any]:
        return {"profile": profile, "start": start, "size": size}

    return {
        "gpu": gpu,
        "model": plan.model,
        "keep": [placed(i.profile, i.start, i.size) | {"busy": i.busy} for i in plan.keep],
        "destroy": [placed(i.profile, i.start, i.size) for i in plan.destroy],
        "create": [placed(p.profile, p.start, p.size) for p in plan.create],
        "final": [placed(p.profile, p.start, p.size) for p in plan.final],
    }


class MigService:
    """One per node agent: serializes reshapes through the reconciler and answers control commands."""

    def __init__(self, reconciler: MigReconciler, *, hooks: AgentHooks | None = None) -> None:
        self.reconciler = reconciler
        self._hooks = hooks
        self.restorer = Restorer(reconciler, hooks or NoHooks())

    def begin_restore(self) -> list[int]:
        """Before the agent serves: withhold every GPU whose journalled layout NVML does not show
        (crash mid-reshape, reboot); the rest are served at once. Returns the GPUs withheld."""
        if self._hooks is not None:
            self._hooks.attach()
        return self.restorer.withhold()

    def restore_in_background(self) -> None:
        """After the agent serves: restore the withheld GPUs one by one, releasing each when done."""
        self.restorer.start()

    def start(self) -> list[ReshapeResult]:
        """Converge journalled GPUs (crash or reboot) before returning, then let reshapes reach the
        agent (tools and tests; the node agent uses ``begin_restore`` and ``restore_in_background``)."""
        try:
            results = recover(self.reconciler)
        finally:
            if self._hooks is not None:
                self._hooks.attach()
        for result in results:
            if result.changed:
                LOG.warning("MIG layout of GPU %d restored from the journal", result.gpu_index)
        return results

    def routes(self) -> dict[str, Callable[[dict[str, Any]], dict[str, Any]]]:
        return {
            "mig.apply": self.route_apply,
            "mig.plan": self.route_plan,
            "mig.status": self.route_status,
            "mig.declare": self.route_declare,
            "mig.demand": self.route_demand,
        }

    def route_declare(self, params: dict[str, Any]) -> dict[str, Any]:
        """``{"layout": <the gpuweave.io/mig-layout annotation value, as a string or an object>}``."""
        layout = params.get("layout")
        if isinstance(layout, dict):
            layout = json.dumps(layout)
        if not isinstance(layout, str):
            raise InvalidInputError('mig.declare needs {"layout": {"gpus": {"3": ["3g.40gb", "3g.40gb"]}}}')
        return {"results": [result_json(r) for r in self.apply_declared(layout)]}

    def route_demand(self, params: dict[str, Any]) -> dict[str, Any]:
        """``{"pending": [{"nvidia.com/mig-1g.10gb": 2}, ...]}``: one resource map per pending pod."""
        pending = params.get("pending")
        if not isinstance(pending, list) or not all(
            isinstance(p, dict) and all(isinstance(v, int) for v in p.values()) for p in pending
        ):
            raise InvalidInputError('mig.demand needs {"pending": [{"nvidia.com/mig-1g.10gb": 2}, ...]}')
        return {"results": [result_json(r) for r in self.apply_demand([mig_requests(p) for p in pending])]}

    def route_apply(self, params: dict[str, Any]) -> dict[str, Any]:
        request = _request(params)
        return result_json(self.reconciler.apply(request.gpu, request.target()))

    def route_plan(self, params: dict[str, Any]) -> dict[str, Any]:
        request = _request(params)
        return plan_json(self.reconciler.plan(request.gpu, request.target()), gpu=request.gpu)

    def route_status(self, params: dict[str, Any]) -> dict[str, Any]:
        gpus: dict[str, Any] = {}
        for index in self.reconciler.mig_gpus():
            current = self.reconciler.current(index)
            gpus[str(index)] = [
                {"profile": i.profile, "start": i.start, "size": i.size, "busy": i.busy} for i in current
            ]
        return {"gpus": gpus, "restoring": self.restorer.restoring()}

    def demand_states(self) -> list[GpuMigState]:
        """The MIG-enabled GPUs as demand planning sees them (busy instances included)."""
        states = []
        for index in self.reconciler.mig_gpus():
            mode = self.reconciler.mig_mode(index)
            if mode is not None and mode[0]:
                states.append(
                    GpuMigState(index, self.reconciler.model(index), self.reconciler.current(index))
                )
        return states

    def apply_demand(self, pending: list[dict[str, int]]) -> list[ReshapeResult]:
        """Reshape MIG-enabled GPUs so pending requests (profile -> count per pod) fit, busy kept."""
        return self._apply_plans(derive_demand_plans(pending, self.demand_states()))

    def apply_demand_if_covered(self, pending: list[dict[str, int]]) -> list[ReshapeResult] | None:
        """Like ``apply_demand``, but only when the result serves every request; None (nothing
        changed) when it would not, e.g. busy instances leave no room."""
        states = self.demand_states()
        plans = derive_demand_plans(pending, states)
        if not demand_covered(pending, states, plans):
            return None
        return self._apply_plans(plans)

    def _apply_plans(self, plans: dict[int, Plan]) -> list[ReshapeResult]:
        results: list[ReshapeResult] = []
        for index, plan in sorted(plans.items()):
            target = [TargetEntry(p.profile, p.start) for p in plan.final]
            results.append(self.reconciler.apply(index, target))
        return results

    def _index_of(self, key: str) -> int:
        gpu = self.reconciler.gpu_by_key(key)
        if gpu is None:
            raise InvalidInputError(f"{MIG_LAYOUT_ANNOTATION}: GPU {key} is not on this node")
        return gpu.index

    def apply_declared(self, annotation: str) -> list[ReshapeResult]:
        """Apply a ``gpuweave.io/mig-layout`` annotation value, GPU by GPU (unlisted GPUs untouched)."""
        results: list[ReshapeResult] = []
        for index, entries in parse_layout_annotation(annotation, resolve=self._index_of).items():
            results.append(self.reconciler.apply(index, None if entries is None else list(entries)))
        return results


class LayoutFollower:
    """Applies the node's ``gpuweave.io/mig-layout`` annotation whenever it changes.

    A watch on the Node hands new values to ``offer`` (applied at once); ``read_annotation``
    returns the annotation's current value (None when absent) and is the fallback, read every
    ``interval_s``, in case the watch misses something. A value that failed (a busy instance
    blocks it) is retried on every round until it succeeds, so the layout converges once the pods
    drain.
    """

    def __init__(
        self, read_annotation: Callable[[], str | None], service: MigService, *, interval_s: float = 10.0
    ) -> None:
        self._read = read_annotation
        self._service = service
        self._interval_s = interval_s
        self._applied: str | None = None
        self._offered: list[str | None] = []
        self._offered_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def offer(self, value: str | None) -> None:
        """The watch saw this annotation value: apply it on the follower's thread without a read."""
        with self._offered_lock:
            self._offered.append(value)
        self._wake.set()

    def poll_once(self) -> list[ReshapeResult]:
        """Read the annotation and apply it if it is new or last failed; returns what changed."""
        return self.apply_value(self._read())

    def apply_value(self, value: str | None) -> list[ReshapeResult]:
        if value is None or value == self._applied:
            return []
        try:
            results = self._service.apply_declared(value)
        except GpuweaveError as exc:
            LOG.warning("MIG layout annotation not applied yet: %s", exc)
            return []
        self._applied = value
        return [r for r in results if r.changed]

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="mig-layout", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._offered_lock:
                offered, self._offered = self._offered[-1:], []
            try:
                if offered:
                    self.apply_value(offered[0])
                else:
                    self.poll_once()
            except Exception as exc:  # the API server or NVML failed; try again next round
                LOG.warning("reading or applying the MIG layout annotation failed: %s", exc)
            if not self._offered:
                self._wake.wait(self._interval_s)
            self._wake.clear()
