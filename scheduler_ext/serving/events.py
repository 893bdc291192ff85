"""Decision Events on pods: why filter rejected every node, and what bind gave the pod.

An operator's first look at a stuck pod is ``kubectl describe pod``; kube-scheduler's own
FailedScheduling Event there says only that the extender refused. The extender adds one short
Event in the same form, with gpuweave's reasons counted across nodes (``summary``), one at
bind naming the node and devices, and one when a gang's places were not held because its
namespace's gangs hold their limit (``gangs.limits``). The same text is what
``gpuweave status --explain`` prints.

Nothing of this runs on the request path beyond a limiter check and a non-blocking queue put:
one writer thread formats and writes (``EventSink``: the API in cluster mode). A pending pod is
filtered again on every retry, so Events are limited: at most one per pod and reason per
``per_pod_s``, and a token bucket of ``rate_per_s`` (burst ``burst``) for all pods together; at
1,000 pods/s that is a trickle, not a storm. Assignment Events have their own, smaller bucket
(``BOUND_RATE_PER_S``, ``BOUND_BURST``): each costs an API write, about as much control-plane CPU
as the Binding itself, while the assignment is on the pod anyway (annotation, ``--explain``); in a
scheduling burst they are a sample, and rejections never wait behind them. What is left out is counted
(``gpuweave_extender_events_dropped{reason}``: pod-interval, rate, queue-full, write-failed).
Every message is written through ``devicemodel.text.safe_text``: the reasons it counts quote the
pod's own text (a gang name, a selector), which reaches ``kubectl describe pod`` escaped and cut.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from devicemodel.assignment import PodAssignment
from devicemodel.errors import GpuweaveError
from devicemodel.text import MAX_EVENT_CHARS, safe_text
from scheduler_ext.cluster.cache import ClusterCache
from scheduler_ext.cluster.objects import PodRecord
from scheduler_ext.decide.summary import (
    device_groups,
    placement_text,
    reason_counts,
    rejection_message,
    shorten,
)
from scheduler_ext.pods.requests import PodRequest
from scheduler_ext.serving.service import Binder, ExtenderService
from scheduler_ext.serving.wire import ExtenderArgs, ExtenderFilterResult
from topology.scoring import score_set

LOG = logging.getLogger(__name__)
REJECTED_REASON = "GpuweaveUnschedulable"  # Warning: filter rejected every node it was asked about
BOUND_REASON = "GpuweaveAssigned"  # Normal: bind wrote the assignment
CONFLICT_REASON = "GpuweaveAssignmentConflict"  # Warning: the pod names a device another pod holds
HOLD_LIMIT_REASON = "GpuweaveGangHoldLimit"  # Warning: its gang's places would pass its namespace's limit
PER_POD_S = 60.0
RATE_PER_S = 20.0  # rejections (Warning): a stuck pod's reasons
BURST = 100
BOUND_RATE_PER_S = 1.0  # assignments (Normal): every pod in a quiet cluster, a sample in a burst
BOUND_BURST = 10
QUEUE_SIZE = 1024
MAX_TRACKED_PODS = 100_000
WARN_EVERY_S = 60.0


@dataclass(frozen=True)
class PodEvent:
    namespace: str
    name: str
    uid: str
    reason: str
    type: str  # Normal | Warning
    message: str


EventSink = Callable[[PodEvent], None]  # raises GpuweaveError when the write failed


class EventLimiter:
    """One Event per (pod, reason) per ``per_pod_s``, and a token bucket over all pods. Thread-safe."""

    def __init__(
        self,
        *,
        per_pod_s: float = PER_POD_S,
        rate_per_s: float = RATE_PER_S,
        burst: int = BURST,
        clock: Callable[[], float] = time.monotonic,
        max_tracked: int = MAX_TRACKED_PODS,
    ) -> None:
        self._per_pod_s, self._rate, self._burst = per_pod_s, rate_per_s, float(burst)
        self._clock = clock
        self._max_tracked = max_tracked
        self._tokens = float(burst)
        self._filled_at = clock()
        self._last: OrderedDict[str, float] = OrderedDict()  # key -> when its last Event was admitted
        self._lock = threading.Lock()

    def admit(self, key: str) -> str:
        """ "" when an Event for ``key`` may go out now, else why not (``pod-interval``, ``rate``).
        The per-pod check comes first: a pod retried in a loop spends none of the shared tokens."""
        with self._lock:
            now = self._clock()
            self._forget_before(now - self._per_pod_s)
            if key in self._last:
                return "pod-interval"
            self._tokens = min(self._burst, self._tokens + (now - self._filled_at) * self._rate)
            self._filled_at = now
            if self._tokens < 1.0:
                return "rate"
            self._tokens -= 1.0
            self._last[key] = now
            if len(self._last) > self._max_tracked:
                self._last.popitem(last=False)
            return ""

    def _forget_before(self, cutoff: float) -> None:
        while self._last:
            key, when = next(iter(self._last.items()))
            if when > cutoff:
                return
            del self._last[key]


class EventCounts:
    """Events written and left out, on the extender's metrics registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.written = Counter(
            "gpuweave_extender_events_written", "Pod Events the extender wrote", registry=registry
        )
        self.dropped = Counter(
            "gpuweave_extender_events_dropped",
            "Pod Events not written, by reason (pod-interval, rate, queue-full, write-failed)",
            ["reason"],
            registry=registry,
        )


Render = Callable[[], str]


class EventRecorder:
    """A bounded queue and one writer thread; ``rejected`` and ``bound`` never block."""

    def __init__(
        self,
        sink: EventSink,
        *,
        cache: ClusterCache,
        limiter: EventLimiter | None = None,
        bound_limiter: EventLimiter | None = None,
        counts: EventCounts | None = None,
        queue_size: int = QUEUE_SIZE,
    ) -> None:
        self._sink = sink
        self._cache = cache
        self._limiter = limiter or EventLimiter()
        self._bound_limiter = bound_limiter or EventLimiter(rate_per_s=BOUND_RATE_PER_S, burst=BOUND_BURST)
        self.counts = counts or EventCounts()
        self._queue: queue.Queue[tuple[PodEvent, Render]] = queue.Queue(maxsize=queue_size)
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpuweave-events", daemon=True)
        self._warned_at = -WARN_EVERY_S

    def start(self) -> None:
        self._thread.start()

    def stop(self, *, join_s: float = 2.0) -> None:
        self._halt.set()
        if self._thread.is_alive():
            self._thread.join(timeout=join_s)

    def rejected(
        self, pod: Mapping[str, Any], *, failed: Mapping[str, str], hopeless: Mapping[str, str]
    ) -> None:
        """Filter rejected every node: the reasons are counted on the writer thread, not here."""

        def render() -> str:
            counts = reason_counts([*failed.items(), *hopeless.items()])
            return rejection_message(len(failed) + len(hopeless), counts)

        self._offer(pod, REJECTED_REASON, "Warning", render, self._limiter)

    def bound(self, pod: Mapping[str, Any], *, node: str, assignment: PodAssignment) -> None:
        def render() -> str:
            return bind_message(self._cache, node, assignment)

        self._offer(pod, BOUND_REASON, "Normal", render, self._bound_limiter)

    def conflict(self, record: PodRecord, *, device: str, holder: str) -> None:
        """The pod's assignment names a device another counted pod holds (``cache.on_conflict``)."""
        pod = {"metadata": {"namespace": record.namespace, "name": record.name, "uid": record.uid}}

        def render() -> str:
            return (
                f"device {device} on node {record.node} is held by pod uid {holder}; this pod's "
                "gpuweave.io/assignment names it too (a second extender binding in this cluster, or "
                "an annotation the extender did not write), so the extender does not count it here"
            )

        self._offer(pod, CONFLICT_REASON, "Warning", render, self._limiter)

    def gang_hold_refused(self, request: PodRequest, reason: str) -> None:
        """Nothing was held for the member's gang: its namespace's gangs hold their limit
        (``GangCoordinator.on_hold_refused``)."""
        pod = {"metadata": {"namespace": request.namespace, "name": request.name, "uid": request.uid}}
        self._offer(pod, HOLD_LIMIT_REASON, "Warning", lambda: shorten(reason), self._limiter)

    def _offer(
        self, pod: Mapping[str, Any], reason: str, kind: str, render: Render, limiter: EventLimiter
    ) -> None:
        metadata = pod.get("metadata") or {}
        event = PodEvent(
            namespace=str(metadata.get("namespace") or "default"),
            name=str(metadata.get("name") or ""),
            uid=str(metadata.get("uid") or ""),
            reason=reason,
            type=kind,
            message="",
        )
        refused = limiter.admit(f"{event.uid or event.namespace + '/' + event.name} {reason}")
        if refused:
            self.counts.dropped.labels(refused).inc()
            return
        try:
            self._queue.put_nowait((event, render))
        except queue.Full:
            self.counts.dropped.labels("queue-full").inc()

    def _run(self) -> None:
        while not self._halt.is_set():
            try:
                event, render = self._queue.get(timeout=0.2)
            except queue.Empty:
                continue
            self._write(event, render)

    def _write(self, event: PodEvent, render: Render) -> None:
        try:
            self._sink(replace(event, message=safe_text(render(), limit=MAX_EVENT_CHARS)))
        except GpuweaveError as exc:
            self.counts.dropped.labels("write-failed").inc()
            now = time.monotonic()
            if now - self._warned_at >= WARN_EVERY_S:  # an API outage: one line a minute, not 20 a second
                self._warned_at = now
                LOG.warning(
                    "event %s on pod %s/%s not written: %s", event.reason, event.namespace, event.name, exc
                )
            return
        self.counts.written.inc()


def bind_message(cache: ClusterCache, node: str, assignment: PodAssignment) -> str:
    """``node X: GPUs 0,1,2,3 (all pairs NVLink, slowest pair 25 GB/s)``."""
    state = cache.node(node)
    groups = device_groups(assignment, state)
    text = placement_text(node, groups)
    whole = sorted({i for g in groups for i in g.gpu_indices})
    if len(whole) > 1 and state is not None and state.layout is not None:
        score = score_set(cache.registry.search(state.layout_id).graph, tuple(whole))
        links = "all pairs NVLink" if score.all_nvlink else "not all pairs NVLink"
        text += f" ({links}, slowest pair {score.bottleneck_gbps:.0f} GB/s)"
    return shorten(text)


class RecordingBinder:
    """The extender's binder, plus a bind Event once the Binding is written."""

    def __init__(self, inner: Binder, events: EventRecorder) -> None:
        self._inner = inner
        self._events = events

    def bind(self, pod: Mapping[str, Any], *, node: str, assignment: PodAssignment | None) -> None:
        self._inner.bind(pod, node=node, assignment=assignment)
        if assignment is not None:
            self._events.bound(pod, node=node, assignment=assignment)


@dataclass
class RecordingService(ExtenderService):
    """The extender's verbs, plus an Event when filter leaves a pod no node."""

    events: EventRecorder | None = None

    def filter(self, args: ExtenderArgs, pod: Mapping[str, Any]) -> ExtenderFilterResult:
        result = super().filter(args, pod)
        failed, hopeless = result.FailedNodes or {}, result.FailedAndUnresolvableNodes or {}
        if self.events is not None and (failed or hopeless) and not _passed(result):
            self.events.rejected(pod, failed=failed, hopeless=hopeless)
        return result


def _passed(result: ExtenderFilterResult) -> int:
    if result.NodeNames is not None:
        return len(result.NodeNames)
    return len(result.Nodes.items or []) if result.Nodes is not None else 0
