"""Decision Events on pods: the rate limit, the writer thread, and the extender that records them."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from devicemodel.assignment import PodAssignment
from devicemodel.contracts import RESOURCE_GPU
from devicemodel.errors import GpuweaveError
from devicemodel.text import MAX_EVENT_CHARS
from gpuweave.simulate.cluster_objects import inventory_object, node_object, pod_object, profile_inventory
from scheduler_ext.app import Extender, assemble, build_core
from scheduler_ext.cluster.cache import ClusterCache
from scheduler_ext.cluster.snapshot import SnapshotBinder, apply_objects
from scheduler_ext.decide.registry import LayoutRegistry
from scheduler_ext.serving.events import (
    BOUND_REASON,
    REJECTED_REASON,
    EventCounts,
    EventLimiter,
    EventRecorder,
    PodEvent,
)
from scheduler_ext.serving.wire import ExtenderArgs, ExtenderBindingArgs
from tests.support.waiting import wait_until


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_one_event_per_pod_per_interval_and_a_shared_token_bucket() -> None:
    clock = Clock()
    limiter = EventLimiter(per_pod_s=60.0, rate_per_s=2.0, burst=3, clock=clock)
    assert [limiter.admit(f"pod-{i}") for i in range(4)] == ["", "", "", "rate"]
    assert limiter.admit("pod-0") == "pod-interval"  # checked before the bucket: spends no token
    clock.now = 0.5  # one token back
    assert (limiter.admit("pod-4"), limiter.admit("pod-5")) == ("", "rate")
    clock.now = 60.5
    assert limiter.admit("pod-0") == ""  # its interval is over


def test_a_thousand_pods_a_second_stay_within_the_budget() -> None:
    """10 s of 1,000 pending pods/s, each filtered again every second: burst + rate x time at most."""
    clock = Clock()
    limiter = EventLimiter(per_pod_s=60.0, rate_per_s=20.0, burst=100, clock=clock)
    admitted: dict[str, int] = {}
    for tick in range(10_000):
        clock.now = tick / 1000
        for pod in {f"pod-{tick}", f"pod-{tick - 1000}"} if tick >= 1000 else {f"pod-{tick}"}:
            if limiter.admit(pod) == "":
                admitted[pod] = admitted.get(pod, 0) + 1
    assert sum(admitted.values()) <= 100 + 20 * 10
    assert sum(admitted.values()) >= 100 + 20 * 9  # the budget is used, not starved
    assert max(admitted.values()) == 1


def _node(name: str) -> list[dict[str, Any]]:
    return [node_object(name, gpus=8), inventory_object(profile_inventory("dgx1-v100", name))]


def _cache() -> ClusterCache:
    cache = ClusterCache(LayoutRegistry())
    apply_objects(iter(_node("n1")), cache)
    return cache


def test_writer_formats_off_the_request_path_and_counts_what_it_drops() -> None:
    written: list[PodEvent] = []
    counts = EventCounts()
    recorder = EventRecorder(written.append, cache=_cache(), counts=counts, queue_size=2)
    pods = [pod_object(f"p{i}") for i in range(5)]
    for pod in pods:  # not started: the queue fills and what does not fit is dropped, not waited for
        recorder.rejected(pod, failed={"n1": "pod needs 8 free GPUs; node has 4 free of 8"}, hopeless={})
    assert counts.dropped.labels("queue-full")._value.get() == 3
    recorder.start()
    wait_until("two events written", lambda: len(written) == 2, timeout=10)
    recorder.stop()
    assert [(e.name, e.reason, e.type) for e in written] == [("p0", REJECTED_REASON, "Warning"),
                                                             ("p1", REJECTED_REASON, "Warning")]
    assert written[0].message == (
        "0/1 nodes are available: 1 node(s): pod needs 8 free GPUs; node has 4 free of 8."
    )
    assert written[0].uid == "uid-default-p0" and counts.written._value.get() == 2


def test_a_failed_write_is_counted_and_the_writer_goes_on() -> None:
    counts = EventCounts()
    calls: list[str] = []

    def flaky(event: PodEvent) -> None:
        calls.append(event.name)
        if event.name == "p0":
            raise GpuweaveError("HTTP 403 Forbidden")

    recorder = EventRecorder(flaky, cache=_cache(), counts=counts)
    recorder.start()
    for name in ("p0", "p1"):
        recorder.rejected(pod_object(name), failed={}, hopeless={"n1": "node offers 8"})
    wait_until("both writes tried", lambda: len(calls) == 2, timeout=10)
    recorder.stop()
    assert counts.dropped.labels("write-failed")._value.get() == 1
    wait_until("the second write counted", lambda: counts.written._value.get() == 1, timeout=10)


@pytest.fixture
def extender() -> Iterator[tuple[Extender, list[PodEvent]]]:
    written: list[PodEvent] = []
    cache, core = build_core()
    apply_objects(iter(_node("n1")), cache)
    wired = assemble(cache, core, SnapshotBinder(cache), event_sink=written.append)
    yield wired, written
    wired.close()


def _filter(extender: Extender, pod: dict[str, Any]) -> Any:
    return extender.service.filter(ExtenderArgs.model_validate({"Pod": pod, "NodeNames": ["n1"]}), pod)


def test_extender_records_a_rejection_once_and_the_bind(extender: tuple[Extender, list[PodEvent]]) -> None:
    wired, written = extender
    nine = pod_object("nine", limits={RESOURCE_GPU: 9})
    for _ in range(3):  # kube-scheduler retries an unschedulable pod: one Event per interval
        assert _filter(wired, nine).NodeNames == []
    quad = pod_object("quad", limits={RESOURCE_GPU: 4})
    assert _filter(wired, quad).NodeNames == ["n1"]  # it fits: no Event from filter
    args = ExtenderBindingArgs(PodName="quad", PodNamespace="default", PodUID="uid-default-quad", Node="n1")
    assert wired.service.bind(args) == ""
    wait_until("two events", lambda: len(written) == 2, timeout=10)
    rejected, bound = written
    assert (rejected.name, rejected.reason) == ("nine", REJECTED_REASON)
    assert rejected.message == "0/1 nodes are available: 1 node(s): pod needs 9 whole GPUs; node offers 8."
    assert (bound.name, bound.reason, bound.type) == ("quad", BOUND_REASON, "Normal")
    assert bound.message.startswith("node n1: GPUs ") and "(all pairs NVLink, slowest pair" in bound.message
    metrics = wired.metrics.render().decode()
    assert 'gpuweave_extender_events_dropped_total{reason="pod-interval"} 2.0' in metrics
    assert "gpuweave_extender_events_written_total 2.0" in metrics


def test_a_stuck_api_never_holds_up_filter() -> None:
    release = threading.Event()
    cache, core = build_core()
    apply_objects(iter(_node("n1")), cache)

    def hang(_: PodEvent) -> None:
        release.wait()

    stuck = assemble(cache, core, SnapshotBinder(cache), event_sink=hang)
    try:
        for i in range(2000):  # the writer hangs on its first write; filter answers every pod regardless
            assert _filter(stuck, pod_object(f"big-{i}", limits={RESOURCE_GPU: 9})).NodeNames == []
        registry = stuck.metrics.registry
        dropped = registry.get_sample_value("gpuweave_extender_events_dropped_total", {"reason": "rate"})
        assert dropped is not None and dropped >= 1500  # about 100 (the burst) went to the queue
    finally:
        release.set()
        stuck.close()


def test_assignments_have_their_own_smaller_bucket_and_never_spend_the_rejections() -> None:
    written: list[PodEvent] = []
    clock = Clock()
    recorder = EventRecorder(
        written.append,
        cache=_cache(),
        limiter=EventLimiter(rate_per_s=20.0, burst=5, clock=clock),
        bound_limiter=EventLimiter(rate_per_s=1.0, burst=2, clock=clock),
        queue_size=100,
    )
    for i in range(6):  # a burst of binds: two Assigned Events, the rest left out
        recorder.bound(pod_object(f"b{i}"), node="n1", assignment=PodAssignment(node="n1", containers={}))
    for i in range(5):  # the rejections' bucket is untouched by them
        recorder.rejected(pod_object(f"r{i}"), failed={"n1": "no room"}, hopeless={})
    assert recorder.counts.dropped.labels("rate")._value.get() == 4
    recorder.start()
    wait_until("seven events written", lambda: len(written) == 7, timeout=10)
    recorder.stop()
    reasons = [e.reason for e in written]
    assert reasons.count(BOUND_REASON) == 2 and reasons.count(REJECTED_REASON) == 5


def test_event_messages_are_escaped_and_clipped_whatever_the_reasons_quote() -> None:
    """A reason quotes the pod's own gang name; the Event kubectl describe shows has it escaped."""
    written: list[PodEvent] = []
    recorder = EventRecorder(written.append, cache=_cache())
    gang = "g\x1b[2J\x1b]0;pwned\x07\u202eexe" + "\u2066" * 200  # 6 characters each once escaped
    failed = {f"n{i}": f"gang default/gang:{gang} reason {i}" for i in range(3)}
    recorder.rejected(pod_object("p"), failed=failed, hopeless={"n9": f"gang {gang}\nforged log line"})
    recorder.start()
    wait_until("the Event written", lambda: len(written) == 1, timeout=10)
    recorder.stop()
    message = written[0].message
    assert len(message) <= MAX_EVENT_CHARS
    assert not any(c in message for c in "\x1b\x07\u202e\n")
    assert "g\\x1b[2J\\x1b]0;pwned\\x07\\u202eexe" in message and "(cut " in message
