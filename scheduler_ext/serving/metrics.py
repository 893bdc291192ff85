"""Prometheus metrics of the extender, on a registry owned by one server (no global state).

Rejection reasons are counted by class (``nvlink``, ``numa``, ``capacity`` ...), not by their
text, whose node names and numbers would explode the label space. GPU capacity and idle GPU per
node kind (GPU product and GPUs per node) are read from the cache's running totals at scrape time
(``CapacityCollector``): one pass over the kinds, nothing per node.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from devicemodel.sharing import MILLI_PER_GPU
from scheduler_ext.decide.reservation import KindTotals, NodeKind
from scheduler_ext.gangs.book import GangBook

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
REASON_CLASSES = (
    ("gang ", "gang"),  # gang planning (``gangs.plan``, ``gangs.service``): every reason starts so
    ("gpu-selector", "selector"),
    ("NVLink", "nvlink"),
    ("NUMA", "numa"),
    ("EFA", "efa"),
    ("MIG", "mig"),
    ("unhealthy", "unhealthy"),
    ("GpuNodeInventory", "no-inventory"),
    ("cache", "unknown-node"),
    ("share", "shares"),
    ("replicas", "shares"),
    ("free", "busy"),
    ("offers", "capacity"),
    ("whole number", "bad-request"),
)


@functools.lru_cache(maxsize=4096)
def reason_class(reason: str) -> str:
    for needle, label in REASON_CLASSES:
        if needle in reason:
            return label
    return "other"


class ExtenderMetrics:
    """Latency per verb, decisions per verb and outcome, rejections per reason class."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.latency = Histogram(
            "gpuweave_extender_request_seconds",
            "Time to answer one extender request, by verb",
            ["verb"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.decisions = Counter(
            "gpuweave_extender_decisions",
            "Node decisions made, by verb and outcome (passed, failed)",
            ["verb", "outcome"],
            registry=self.registry,
        )
        self.rejections = Counter(
            "gpuweave_extender_rejections",
            "Nodes rejected for a pod, by reason class",
            ["reason"],
            registry=self.registry,
        )
        self.bad_requests = Counter(
            "gpuweave_extender_bad_requests",
            "Requests answered 400, by verb",
            ["verb"],
            registry=self.registry,
        )
        self.binds = Counter(
            "gpuweave_extender_binds", "Bind outcomes (bound, error)", ["outcome"], registry=self.registry
        )
        self.assignment_conflicts = Counter(
            "gpuweave_extender_assignment_conflicts",
            "Devices a pod's assignment names while another counted pod holds them (not counted for it)",
            registry=self.registry,
        )
        self._latency_of: dict[str, Any] = {}  # verb -> its ``latency`` child
        self._binds_of: dict[str, Any] = {}  # outcome -> its ``binds`` child
        self.cached_nodes = Gauge(
            "gpuweave_extender_cached_nodes", "Nodes in the cache", registry=self.registry
        )
        self.ready = Gauge(
            "gpuweave_extender_ready",
            "1 once the cache has synced (the extender answers /readyz 200), else 0",
            registry=self.registry,
        )
        self.gangs = Counter(
            "gpuweave_extender_gangs",
            "Gang plans by outcome (planned, missed, expired, completed, incomplete: members not all "
            "created, over-limit: its namespace's holds at their limit, released: members deleted)",
            ["outcome"],
            registry=self.registry,
        )

        self.leader_transitions = Counter(
            "gpuweave_extender_leader_transitions",
            "Changes of this replica's leadership of the extender's Lease, by what it became "
            "(leader, standby)",
            ["to"],
            registry=self.registry,
        )

    def scraped(self, *, nodes: int, ready: bool) -> None:
        """The cache's figures, set as a scrape reads them (no timer keeps them fresh)."""
        self.cached_nodes.set(nodes)
        self.ready.set(1 if ready else 0)

    def verb_latency(self, verb: str) -> Any:
        """The latency histogram's child for ``verb``, looked up once (``labels`` per request cost
        a lock and a tuple of the label values each time)."""
        child = self._latency_of.get(verb)
        if child is None:
            child = self._latency_of.setdefault(verb, self.latency.labels(verb))
        return child

    def bind_outcome(self, outcome: str) -> Any:
        """The binds counter's child for ``outcome`` (bound, error), looked up once."""
        child = self._binds_of.get(outcome)
        if child is None:
            child = self._binds_of.setdefault(outcome, self.binds.labels(outcome))
        return child

    def gang_outcome(self, outcome: str) -> None:
        self.gangs.labels(outcome).inc()

    def watch_gangs(self, book: GangBook, *, sweep: Callable[[], None]) -> None:
        """Export the open gang reservations and their held devices (expired ones released first)."""
        self.registry.register(GangCollector(book, sweep))

    def watch_capacity(self, kinds: KindTotals) -> None:
        """Export GPU capacity and idle GPU per node kind from ``kinds`` (the cache's running totals)."""
        self.registry.register(CapacityCollector(kinds))

    def watch_leader(self, leading: Callable[[], bool]) -> None:
        """Export ``gpuweave_extender_leader``: 1 while this replica's controllers run."""
        self.registry.register(LeaderCollector(leading))

    def leader_transition(self, to: str) -> None:
        self.leader_transitions.labels(to).inc()

    def watch_controller_writes(self, controller: str, writes: Callable[[], int]) -> None:
        """Export ``gpuweave_extender_controller_writes``: the API writes ``controller`` made here."""
        self.registry.register(WritesCollector(controller, writes))

    def decided(self, verb: str, *, passed: int, rejected: Mapping[str, int]) -> None:
        """``rejected``: nodes rejected per reason (counted per distinct reason, not per node)."""
        self.decisions.labels(verb, "passed").inc(passed)
        failed = sum(rejected.values())
        if failed:
            self.decisions.labels(verb, "failed").inc(failed)
            counts: dict[str, int] = {}
            for reason, count in rejected.items():  # classify each distinct reason once
                label = reason_class(reason)
                counts[label] = counts.get(label, 0) + count
            for label, count in counts.items():
                self.rejections.labels(label).inc(count)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class CapacityCollector(Collector):
    """``gpuweave_extender_gpus`` and ``gpuweave_extender_free_gpus`` by ``product`` and
    ``gpus_per_node``: the GPUs of the nodes with an inventory, and their idle capacity in GPUs
    (free GPUs plus the unused part of shared GPUs, as placement counts it). Allocation is
    ``1 - free / gpus``. Kinds that differ only in CPU or memory are added together."""

    def __init__(self, kinds: KindTotals) -> None:
        self._kinds = kinds

    def describe(self) -> list[GaugeMetricFamily]:
        return list(self._families({}, {}))

    def collect(self) -> Iterator[GaugeMetricFamily]:
        # dict(): one atomic copy of each, while the cache may be updating them
        return self._families(dict(self._kinds.capacity), dict(self._kinds.free))

    @staticmethod
    def _families(
        capacity: Mapping[NodeKind, int], free: Mapping[NodeKind, float]
    ) -> Iterator[GaugeMetricFamily]:
        labels = ["product", "gpus_per_node"]
        gpus = GaugeMetricFamily("gpuweave_extender_gpus", "GPUs on nodes of this kind", labels=labels)
        idle = GaugeMetricFamily(
            "gpuweave_extender_free_gpus", "Idle GPU capacity on nodes of this kind, in GPUs", labels=labels
        )
        summed: dict[tuple[str, str], list[float]] = {}
        for kind, built in capacity.items():
            row = summed.setdefault((kind[0], str(kind[1])), [0.0, 0.0])
            row[0] += built
            row[1] += free.get(kind, 0.0) / MILLI_PER_GPU
        for key, (built_sum, free_sum) in sorted(summed.items()):
            gpus.add_metric(list(key), built_sum)
            idle.add_metric(list(key), free_sum)
        yield gpus
        yield idle


class GangCollector(Collector):
    """Gang reservations and their held devices; waiting gangs and the nodes kept for them."""

    def __init__(self, book: GangBook, sweep: Callable[[], None]) -> None:
        self._book = book
        self._sweep = sweep

    def describe(self) -> list[GaugeMetricFamily]:
        return list(self._families(0, 0))

    def collect(self) -> Iterator[GaugeMetricFamily]:
        self._sweep()  # a scrape after the TTL shows the devices released, not a stale hold
        waiting = self._book.waiting()
        return self._families(
            len(self._book.reservations()),
            self._book.held_devices(),
            len(waiting),
            len(self._book.kept_nodes()),
            self._book.recovering(),
        )

    @staticmethod
    def _families(
        reservations: int, devices: int, waiting: int = 0, kept: int = 0, recovering: int = 0
    ) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(
            "gpuweave_extender_gang_reservations", "Gang reservations held now", value=reservations
        )
        yield GaugeMetricFamily(
            "gpuweave_extender_gang_reserved_devices",
            "Devices held for gang members that have not bound yet",
            value=devices,
        )
        yield GaugeMetricFamily(
            "gpuweave_extender_gangs_waiting", "Gangs that did not fit, keeping places", value=waiting
        )
        yield GaugeMetricFamily(
            "gpuweave_extender_gang_kept_nodes",
            "Nodes kept for waiting gangs from pods that fit elsewhere",
            value=kept,
        )
        yield GaugeMetricFamily(
            "gpuweave_extender_gangs_recovering",
            "Gangs (families) that lost a member to a fault or a preemption and have not run again",
            value=recovering,
        )


class LeaderCollector(Collector):
    """``gpuweave_extender_leader``, read at scrape time (the Lease can lapse between two renewals)."""

    def __init__(self, leading: Callable[[], bool]) -> None:
        self._leading = leading

    def describe(self) -> list[GaugeMetricFamily]:
        return [self._family(0)]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield self._family(1 if self._leading() else 0)

    @staticmethod
    def _family(value: int) -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "gpuweave_extender_leader",
            "1 while this replica holds the extender's Lease and runs its controllers, else 0",
            value=value,
        )


class WritesCollector(Collector):
    """A controller's API writes, counted by the controller itself and read at scrape time."""

    def __init__(self, controller: str, writes: Callable[[], int]) -> None:
        self._controller, self._writes = controller, writes

    def describe(self) -> list[CounterMetricFamily]:
        return [self._family(0)]

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield self._family(self._writes())

    def _family(self, value: int) -> CounterMetricFamily:
        family = CounterMetricFamily(
            "gpuweave_extender_controller_writes",
            "Writes to the API server a controller of this replica made (status of Kueue objects)",
            labels=["controller"],
        )
        family.add_metric([self._controller], value)
        return family
