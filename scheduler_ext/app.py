"""Wiring of one extender process: registry, core, cache, feeder, binder, service, HTTP server.

``build_snapshot_extender`` and ``build_kube_extender`` are the two ways to assemble it; the CLI
command and the tests call them, so tests run exactly what production runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from devicemodel.contracts import LABEL_PREFLIGHT
from netio.gate import GateLimits
from netio.probe_http import PROBE_LIMITS, ProbeListener
from scheduler_ext.cluster.cache import ClusterCache
from scheduler_ext.cluster.objects import PodRecord
from scheduler_ext.cluster.snapshot import SnapshotBinder, load_snapshot
from scheduler_ext.decide.core import DecisionCore
from scheduler_ext.decide.registry import LayoutRegistry
from scheduler_ext.decide.workload import WorkloadLearner
from scheduler_ext.gangs.book import GangBook
from scheduler_ext.gangs.policy import GangPolicy, gang_policy
from scheduler_ext.gangs.service import GangCoordinator, GangSettings, PodGroupSizes
from scheduler_ext.gangs.tier_wait import TierWaits
from scheduler_ext.pods.selector import SelectorCache
from scheduler_ext.serving.events import (
    EventCounts,
    EventRecorder,
    EventSink,
    RecordingBinder,
    RecordingService,
)
from scheduler_ext.serving.metrics import ExtenderMetrics
from scheduler_ext.serving.probes import probe_listener
from scheduler_ext.serving.server import ExtenderHTTPServer
from scheduler_ext.serving.service import Binder, ExtenderService
from topology.fragmentation import TargetWorkload


@dataclass
class Extender:
    """A wired extender; ``close`` stops the server and any watches."""

    cache: ClusterCache
    core: DecisionCore
    service: ExtenderService
    metrics: ExtenderMetrics
    gangs: GangCoordinator | None = None  # the gang service while gangs are on, to look into
    server: ExtenderHTTPServer | None = None
    probe_server: ProbeListener | None = None
    stoppers: tuple[object, ...] = ()

    @property
    def gang_policy(self) -> GangPolicy:
        """The gang policy the verbs call: the gang service, or the no-op one (``gangs.policy``)."""
        return self.service.gangs

    def serve(
        self, *, host: str, port: int, tls_cert: Path | None = None, tls_key: Path | None = None
    ) -> str:
        """Bind the HTTP(S) listener and serve in a background thread; returns its URL."""
        server = ExtenderHTTPServer((host, port), service=self.service, metrics=self.metrics)
        if tls_cert is not None and tls_key is not None:
            try:
                server.use_tls(cert=tls_cert, key=tls_key)
            except BaseException:
                server.server_close()
                raise
        self.server = server
        server.serve_in_thread()
        return server.url

    def serve_probes(self, *, host: str, port: int, limits: GateLimits = PROBE_LIMITS) -> str:
        """Bind the read-only probe listener (healthz, readyz, metrics); returns its URL."""
        probes = probe_listener((host, port), cache=self.cache, metrics=self.metrics, limits=limits)
        self.probe_server = probes
        probes.start()
        return probes.url

    def close(self) -> None:
        for stopper in self.stoppers:
            stop = getattr(stopper, "stop", None)
            if callable(stop):
                stop()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        if self.probe_server is not None:
            self.probe_server.stop()
        self.server = self.probe_server = None
        self.core.selectors.close()


def build_core(
    *,
    share_workload: TargetWorkload | None = None,
    selectors: SelectorCache | None = None,
    gangs: GangSettings | None = None,
) -> tuple[ClusterCache, DecisionCore]:
    """The cache and the decision core over one layout registry. The core learns the workload
    FGD scores against from the pods it sees; ``share_workload`` (``--workload FILE``) pins it.
    ``selectors``: the gpu-selector cache with its budget and sandbox (default: Kubernetes' limits).
    ``gangs``: its network tier labels are the node labels the cache keeps."""
    registry = LayoutRegistry()
    core = DecisionCore(registry, selectors=selectors, workload=WorkloadLearner(pinned=share_workload))
    label_keys = (*(gangs or GangSettings()).tier_labels, LABEL_PREFLIGHT)  # LABEL_PREFLIGHT: who serves them
    return ClusterCache(registry, label_keys=label_keys), core


def gang_coordinator(
    cache: ClusterCache, core: DecisionCore, settings: GangSettings, metrics: ExtenderMetrics
) -> GangCoordinator | None:
    """All-or-nothing gang placement, or None when ``--gang-ttl 0`` turned it off."""
    if settings.ttl_s <= 0:
        return None
    coordinator = GangCoordinator(
        cache=cache,
        core=core,
        book=GangBook(ttl_s=settings.ttl_s, clock=settings.clock),
        tier_labels=settings.tier_labels,
        pod_groups=settings.pod_groups or PodGroupSizes(),
        hold_limit=settings.hold_limit,
        on_outcome=metrics.gang_outcome,
        tier_waits=TierWaits(
            cache,
            settings=settings.tier_cost,
            tier_labels=settings.tier_labels,
            clock=settings.clock,
            wall_clock=settings.wall_clock,
        ),
    )
    metrics.watch_gangs(coordinator.book, sweep=coordinator.sweep)
    return coordinator


def assemble(
    cache: ClusterCache,
    core: DecisionCore,
    binder: Binder,
    *,
    stoppers: tuple[object, ...] = (),
    event_sink: EventSink | None = None,
    keep: int = 0,
    gangs: GangSettings | None = None,
) -> Extender:
    """``event_sink``: where decision Events on pods go (the API in cluster mode; none offline).
    ``keep``: filter passes at most this many fitting nodes (``shortlist``; 0: every one).
    ``gangs``: gang placement settings (default: on, 60 s reservations, the default tiers)."""
    metrics = ExtenderMetrics()
    metrics.watch_capacity(cache.kinds)
    coordinator = gang_coordinator(cache, core, gangs or GangSettings(), metrics)
    policy = gang_policy(coordinator)
    cache.on_pod_gone = policy.pod_gone  # members deleted: their gang's holds go at once
    cache.on_conflict = lambda _record, _device, _holder: metrics.assignment_conflicts.inc()
    if event_sink is None:
        service = ExtenderService(
            cache=cache, core=core, binder=binder, observer=metrics, keep=keep, gangs=policy
        )
        return Extender(
            cache=cache, core=core, service=service, metrics=metrics, stoppers=stoppers, gangs=coordinator
        )
    events = EventRecorder(event_sink, cache=cache, counts=EventCounts(metrics.registry))
    events.start()
    policy.tell_refused_holds(events.gang_hold_refused)

    def on_conflict(record: PodRecord, device: str, holder: str) -> None:
        metrics.assignment_conflicts.inc()
        events.conflict(record, device=device, holder=holder)

    cache.on_conflict = on_conflict
    service = RecordingService(
        cache=cache,
        core=core,
        binder=RecordingBinder(binder, events),
        observer=metrics,
        events=events,
        keep=keep,
        gangs=policy,
    )
    return Extender(
        cache=cache,
        core=core,
        service=service,
        metrics=metrics,
        stoppers=(events, *stoppers),
        gangs=coordinator,
    )


def build_snapshot_extender(
    snapshot: Path,
    *,
    workload: TargetWorkload | None = None,
    selectors: SelectorCache | None = None,
    keep: int = 0,
    gangs: GangSettings | None = None,
) -> Extender:
    cache, core = build_core(share_workload=workload, selectors=selectors, gangs=gangs)
    load_snapshot(snapshot, cache)
    extender = assemble(cache, core, SnapshotBinder(cache), keep=keep, gangs=gangs)
    extender.gang_policy.rebuild()
    return extender
