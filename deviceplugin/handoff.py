"""Follow the extender's recorded device choice when the kubelet asks for a preference.

The kubelet's GetPreferredAllocation carries no pod identity, so the agent infers it: among the
pods on this node that are still Pending and carry a ``gpuweave.io/assignment`` annotation, it
looks for container assignments for this resource with exactly the requested size, all of whose
IDs are offered and which include every must-include ID, not served yet. One such (pod,
container) → its IDs. Several (a burst of equal pods) → the earliest in admission order: the
kubelet admits pods one at a time in the order its watch (``spec.nodeName=<node>``) delivers
them, which is the order in which they became bound to the node, and a pod's containers in spec
order. The agent's own watch on the same selector sees the same order; the resourceVersion of
the first event in which it saw a pod bound ranks it (as integers when every candidate's parses,
as etcd's do; else the order this agent saw them). None → this agent's watch may simply not have
shown the pod yet (the kubelet's watch of the same binding can be ahead of it, after a quiet spell
as well as in a burst), so it waits for the watch (at most ``CATCH_UP_S``) and looks again; then
no hint, and the local optimum from the same scoring code is used. A GPU pod the extender did not
place therefore waits ``CATCH_UP_S`` per resource at admission. No lock held across the wait and
no API call on the kubelet's path: the pod view is kept fresh by a watcher in the background
(``deviceplugin.kube``).

Every outcome is counted; when the kubelet then allocates something other than the hint, or a
pending assignment names devices that are not offered, a mismatch is counted and reported.
``corrections`` is the backstop after admission: it compares each pod's annotation with what the
kubelet really allocated (pod-resources) and yields the corrected assignment.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from devicemodel.assignment import ContainerAssignment, PodAssignment, parent_gpu_of_share
from devicemodel.errors import InvalidInputError
from deviceplugin.preferred import PreferenceRequest
from nodeagent.devices import PluginDevice
from nodeagent.metrics import AgentMetrics
from nodeagent.versioned import VersionedState

log = logging.getLogger(__name__)

Reporter = Callable[["PendingPod", str, str], None]  # (pod, reason, message)
CATCH_UP_S = 0.2  # longest a preference waits for this agent's pod watch to show the pod
TERMINAL_PHASES = ("Succeeded", "Failed")


@dataclass(frozen=True)
class PendingPod:
    uid: str
    namespace: str
    name: str
    assignment: PodAssignment
    created: str = ""  # RFC 3339 creation time (informational; bound order ranks candidates)
    seen: int = 0  # order in which this agent first saw the pod (its watch order)
    bound: str = ""  # resourceVersion of the first event in which this agent saw the pod bound here
    phase: str = "Pending"
    resource_version: str = ""  # the latest one seen: the precondition of an annotation correction
    requests_imex: bool = False  # its spec asks for gpuweave.io/imex-channel (the node has one)


def _as_int(resource_version: str) -> int | None:
    return int(resource_version) if resource_version.isdigit() else None


def admission_ranks(pods: Iterable[PendingPod]) -> dict[str, tuple[int, int]]:
    """Pod UID -> rank in the kubelet's admission order: bound resourceVersion when every one
    parses as an integer (etcd's do), else the order this agent's watch saw them."""
    listed = list(pods)
    numbers = [_as_int(p.bound) for p in listed]
    if all(n is not None for n in numbers):
        return {p.uid: (n or 0, p.seen) for p, n in zip(listed, numbers, strict=True)}
    return {p.uid: (p.seen, 0) for p in listed}


@dataclass(frozen=True)
class _Hint:
    pod: PendingPod
    container: str
    ids: tuple[str, ...]
    position: int  # the container's place in the pod's assignment (spec order)


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


class PodView(VersionedState):
    """Thread-safe set of this node's live pods that carry an assignment, with their bound order."""

    def __init__(self) -> None:
        super().__init__()
        self._pods: dict[str, PendingPod] = {}
        self._bound: dict[str, str] = {}  # every pod seen on the node: uid -> first resourceVersion
        self._arrivals = 0

    def upsert(
        self,
        *,
        uid: str,
        namespace: str,
        name: str,
        phase: str,
        annotation: str | None,
        created: str = "",
        resource_version: str = "",
        requests_imex: bool = False,
    ) -> None:
        assignment = None
        if phase not in TERMINAL_PHASES and annotation:
            try:
                assignment = PodAssignment.from_annotation(annotation)
            except InvalidInputError as exc:
                log.warning("pod %s/%s: %s", namespace, name, exc)
        with self._changed:
            bound = self._bound.setdefault(uid, resource_version)
            self._touch()
            if assignment is None:
                self._pods.pop(uid, None)
                return
            known = self._pods.get(uid)
            if known is None:
                self._arrivals += 1
            seen = known.seen if known else self._arrivals
            self._pods[uid] = PendingPod(
                uid, namespace, name, assignment, created, seen, bound, phase, resource_version, requests_imex
            )

    def remove(self, uid: str) -> None:
        with self._changed:
            self._pods.pop(uid, None)
            self._bound.pop(uid, None)
            self._touch()

    def pending(self) -> list[PendingPod]:
        """Pods not admitted yet (phase Pending) with an assignment."""
        with self._lock:
            return [p for p in self._pods.values() if p.phase == "Pending"]

    def assigned(self) -> list[PendingPod]:
        """Every live pod with an assignment, admitted or not (the backstop compares these)."""
        with self._lock:
            return list(self._pods.values())


class HandoffMatcher:
    """Implements ``deviceplugin.frontend.HandoffSource`` over a ``PodView``."""

    def __init__(
        self,
        view: PodView,
        *,
        node: str,
        metrics: AgentMetrics,
        report: Reporter | None = None,
        catch_up_s: float = CATCH_UP_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._view = view
        self._node = node
        self._metrics = metrics
        self._report = report
        self._catch_up_s = catch_up_s
        self._clock = clock
        self._lock = threading.Lock()
        self._served: set[tuple[str, str, str]] = set()  # (pod uid, container, resource)
        self._outstanding: dict[str, _Hint] = {}  # resource -> hint given, awaiting Allocate
        self._allocation_listeners: list[Callable[[], None]] = []

    def add_allocation_listener(self, listener: Callable[[], None]) -> None:
        """``listener()`` runs after every Allocate (the backstop audit starts its polling)."""
        self._allocation_listeners.append(listener)

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

    def _candidates_caught_up(self, request: PreferenceRequest) -> tuple[list[_Hint], list[_Hint]]:
        """Candidates; when there are none, wait up to ``catch_up_s`` for the view to show the pod.
        The watch delivers pods in bound order, so a view that lags shows a prefix: the pod being
        admitted is missing, not replaced."""
        fits, misfits = self._candidates(request)
        if fits or misfits or self._catch_up_s <= 0:
            return fits, misfits
        deadline = self._clock() + self._catch_up_s
        while not fits and not misfits and (left := deadline - self._clock()) > 0:
            if not self._view.wait_for_change(self._view.version(), timeout=left):
                break
            fits, misfits = self._candidates(request)
        self._count(request.resource, "waited")
        return fits, misfits

    def hint(self, request: PreferenceRequest, devices: dict[str, PluginDevice]) -> list[str] | None:
        fits, misfits = self._candidates_caught_up(request)
        if fits:
            ranks = admission_ranks({h.pod.uid: h.pod for h in fits}.values())
            chosen = min(fits, key=lambda h: (ranks[h.pod.uid], h.position))
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
        for listener in list(self._allocation_listeners):
            listener()

    def _emit(self, hint: _Hint, message: str) -> None:
        log.warning("handoff mismatch for pod %s/%s: %s", hint.pod.namespace, hint.pod.name, message)
        if self._report is not None:
            try:
                self._report(hint.pod, "GpuAssignmentMismatch", message)
            except Exception:
                log.exception("cannot report handoff mismatch")


# ---- the backstop: annotations against the kubelet's real allocation ------------------------
Held = dict[tuple[str, str], dict[str, dict[str, frozenset[str]]]]  # (ns, name) -> container -> resource


@dataclass(frozen=True)
class Correction:
    """A pod whose annotation differs from what the kubelet allocated, and the annotation that matches."""

    pod: PendingPod
    corrected: PodAssignment
    changes: tuple[str, ...]  # "container resource: before -> after", for the Event and the log
    devices_differ: bool  # False when only share unit numbers differ (same GPU): not a mismatch


def _physical(ids: Iterable[str]) -> frozenset[str]:
    return frozenset(parent_gpu_of_share(i) or i for i in ids)


def correction_for(pod: PendingPod, held: dict[str, dict[str, frozenset[str]]]) -> Correction | None:
    """Compare one pod's annotation with the kubelet's allocation (container -> resource -> IDs).

    Only (container, resource) pairs the kubelet lists are compared: others were not admitted
    yet or are not the kubelet's to tell."""
    containers = dict(pod.assignment.containers)
    changes: list[str] = []
    differ = False
    for container, assigned in pod.assignment.containers.items():
        devices = dict(assigned.devices)
        for resource, ids in assigned.devices.items():
            real = held.get(container, {}).get(resource)
            if not real or real == frozenset(ids):
                continue
            devices[resource] = sorted(real)
            changes.append(f"{container} {resource}: {', '.join(ids)} -> {', '.join(sorted(real))}")
            differ = differ or _physical(ids) != _physical(real)
        containers[container] = ContainerAssignment(devices=devices)
    if not changes:
        return None
    corrected = PodAssignment(version=pod.assignment.version, node=pod.assignment.node, containers=containers)
    return Correction(pod, corrected, tuple(changes), differ)


def corrections(pods: Iterable[PendingPod], held: Held) -> list[Correction]:
    """Every pod whose annotation the kubelet's allocation contradicts."""
    found = []
    for pod in pods:
        correction = correction_for(pod, held.get((pod.namespace, pod.name), {}))
        if correction is not None:
            found.append(correction)
    return found
