"""Follow the extender's recorded device choice when the kubelet asks for a preference.

The kubelet's GetPreferredAllocation carries no pod identity, so the agent infers it: among the
pods on this node that are still Pending and carry a ``gpuweave.io/assignment`` annotation, it
looks for container assignments for this resource with exactly the requested size, all of whose
IDs are offered and which include every must-include ID, not served yet. One such (pod,
container) → its IDs. Several (a burst of equal pods) → the earliest in admission order: the
kubelet admits pods one at a time in the order its watch delivers them (creation time within a
burst, then the order this agent's own watch saw them) and a pod's containers in spec order.
None → no hint, and the local optimum from the same scoring code is used. No lock and no API call
on the kubelet's path: the pod view is kept fresh by a watcher in the background
(``deviceplugin.kube``).

Every outcome is counted; when the kubelet then allocates something other than the hint, or a
pending assignment names devices that are not offered, a mismatch is counted and reported.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace

from deviceplugin.devices import PluginDevice
from deviceplugin.metrics import AgentMetrics
from deviceplugin.preferred import PreferenceRequest
from topology.assignment import PodAssignment, parent_gpu_of_share
from topology.errors import InvalidInputError

log = logging.getLogger(__name__)

Reporter = Callable[["PendingPod", str, str], None]  # (pod, reason, message)


@dataclass(frozen=True)
class PendingPod:
    uid: str
    namespace: str
    name: str
    assignment: PodAssignment
    created: str = ""  # RFC 3339 creation time: sorts as text
    seen: int = 0  # order in which this agent first saw the pod (its watch order)


@dataclass(frozen=True)
class _Hint:
    pod: PendingPod
    container: str
    ids: tuple[str, ...]
    position: int  # the container's place in the pod's assignment (spec order)

    @property
    def admission_order(self) -> tuple[str, int, int]:
        """The kubelet admits pods one at a time in watch order (creation time within a burst),
        and a pod's containers in spec order: the earliest candidate is the one being admitted."""
        return (self.pod.created, self.pod.seen, self.position)


def _fit(ids: tuple[str, ...], *, offered: tuple[str, ...], must: set[str]) -> tuple[str, ...] | None:
    """The assigned IDs if all are offered; for share units, as many offered units of the same GPU.

    What matters for a share is the GPU: unit numbers are interchangeable, and the kubelet's
    bookkeeping of which units are free may differ from the extender's.
    """
    offered_set = set(offered)
    if set(ids) <= offered_set and must <= set(ids):
        return ids
    gpus = {parent_gpu_of_share(i) for i in ids}
    gpu = gpus.pop() if len(gpus) == 1 else None
    if gpu is None or any(parent_gpu_of_share(m) != gpu for m in must):
        return None
    kind = ids[0].partition("::")[2].rsplit("-", 1)[0]
    same_gpu = [i for i in offered if i.startswith(f"{gpu}::{kind}-") and i not in must]
    chosen = sorted(must) + sorted(same_gpu, key=lambda i: (i not in ids, i))[: len(ids) - len(must)]
    return tuple(chosen) if len(chosen) == len(ids) else None


class PodView:
    """Thread-safe set of this node's Pending pods that carry an assignment."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pods: dict[str, PendingPod] = {}
        self._arrivals = 0

    def upsert(
        self, *, uid: str, namespace: str, name: str, phase: str, annotation: str | None, created: str = ""
    ) -> None:
        assignment = None
        if phase == "Pending" and annotation:
            try:
                assignment = PodAssignment.from_annotation(annotation)
            except InvalidInputError as exc:
                log.warning("pod %s/%s: %s", namespace, name, exc)
        with self._lock:
            if assignment is None:
                self._pods.pop(uid, None)
                return
            known = self._pods.get(uid)
            if known is None:
                self._arrivals += 1
            seen = known.seen if known else self._arrivals
            self._pods[uid] = PendingPod(uid, namespace, name, assignment, created, seen)

    def remove(self, uid: str) -> None:
        with self._lock:
            self._pods.pop(uid, None)

    def replace_all(self, pods: list[PendingPod]) -> None:
        """After a re-list: keep the arrival order of pods already known."""
        with self._lock:
            known, fresh = self._pods, {}
            for pod in sorted(pods, key=lambda p: p.seen):
                if pod.uid not in known:
                    self._arrivals += 1
                seen = known[pod.uid].seen if pod.uid in known else self._arrivals
                fresh[pod.uid] = replace(pod, seen=seen)
            self._pods = fresh

    def pending(self) -> list[PendingPod]:
        with self._lock:
            return list(self._pods.values())


class HandoffMatcher:
    """Implements ``deviceplugin.agent.HandoffSource`` over a ``PodView``."""

    def __init__(
        self, view: PodView, *, node: str, metrics: AgentMetrics, report: Reporter | None = None
    ) -> None:
        self._view = view
        self._node = node
        self._metrics = metrics
        self._report = report
        self._lock = threading.Lock()
        self._served: set[tuple[str, str, str]] = set()  # (pod uid, container, resource)
        self._outstanding: dict[str, _Hint] = {}  # resource -> hint given, awaiting Allocate

    def _count(self, resource: str, outcome: str) -> None:
        self._metrics.handoff.labels(resource, outcome).inc()

    def _candidates(self, request: PreferenceRequest) -> tuple[list[_Hint], list[_Hint]]:
        """(matching container assignments, same-size ones that do not fit the offered set)."""
        must = set(request.must_include)
        fits: list[_Hint] = []
        misfits: list[_Hint] = []
        pending = self._view.pending()
        live = {pod.uid for pod in pending}
        with self._lock:
            self._served = {key for key in self._served if key[0] in live}  # bounded by pending pods
            served = set(self._served)
        for pod in pending:
            if pod.assignment.node != self._node:
                continue
            for position, (container, assigned) in enumerate(pod.assignment.containers.items()):
                ids = tuple(assigned.devices.get(request.resource, ()))
                if len(ids) != request.size or (pod.uid, container, request.resource) in served:
                    continue
                fitted = _fit(ids, offered=request.available, must=must)
                if fitted is None:
                    misfits.append(_Hint(pod, container, ids, position))
                else:
                    fits.append(_Hint(pod, container, fitted, position))
        return fits, misfits

    def hint(self, request: PreferenceRequest, devices: dict[str, PluginDevice]) -> list[str] | None:
        fits, misfits = self._candidates(request)
        if fits:
            chosen = min(fits, key=lambda h: h.admission_order)
            with self._lock:
                self._served.add((chosen.pod.uid, chosen.container, request.resource))
                self._outstanding[request.resource] = chosen
            self._count(request.resource, "followed" if len(fits) == 1 else "followed_earliest")
            return list(chosen.ids)
        if misfits:
            self._count(request.resource, "mismatch")
            for hint in misfits:
                self._emit(
                    hint, f"assigned {request.resource} devices {', '.join(hint.ids)} are not all available"
                )
        else:
            self._count(request.resource, "no_assignment")
        return None

    def observe_allocation(self, resource: str, device_ids: list[str]) -> None:
        """Called after Allocate: a hint the kubelet did not follow is a mismatch."""
        with self._lock:
            hint = self._outstanding.pop(resource, None)
        if hint is not None and set(hint.ids) != set(device_ids):
            self._count(resource, "mismatch")
            self._emit(hint, f"kubelet allocated {', '.join(device_ids)} instead of {', '.join(hint.ids)}")

    def _emit(self, hint: _Hint, message: str) -> None:
        log.warning("handoff mismatch for pod %s/%s: %s", hint.pod.namespace, hint.pod.name, message)
        if self._report is not None:
            try:
                self._report(hint.pod, "GpuAssignmentMismatch", message)
            except Exception:
                log.exception("cannot report handoff mismatch")
