"""The series gpuweave exports, read from the registries its processes serve on /metrics.

The extender's registry is built the way ``gpuweave extender`` builds it (``scheduler_ext.app``,
here over a one-node snapshot so per-kind collectors have a sample, with the leader election's
collectors that ``scheduler_ext.kube`` adds in cluster mode); the node agent's is
``AgentMetrics`` with ``HealthMetrics``, ``MigMetrics`` and the per-pod ``UsageMetrics`` on the same
registry, as ``gpuweave/node/health.py``, ``gpuweave/node/mig.py`` and ``gpuweave/node/usage.py`` wire
them. A renamed or removed metric
disappears from this map, so the dashboard and rules tests fail.
"""

from __future__ import annotations

import json
from pathlib import Path

from prometheus_client import CollectorRegistry

from gpuweave.simulate.cluster_objects import cluster_list, inventory_object, node_object, profile_inventory
from health.metrics import HealthMetrics
from mig.metrics import MigMetrics
from nodeagent.metrics import AgentMetrics
from nodeagent.pod_usage import ContainerKey, PodGpuUsage
from nodeagent.usage_service import UsageMetrics
from scheduler_ext.app import build_snapshot_extender

# Labels the scrape adds: Prometheus' target labels, the Prometheus Operator's Service discovery,
# and `node`, relabelled from the pod's node by the chart's node-agent ServiceMonitor.
SCRAPE_LABELS = frozenset({"job", "instance", "namespace", "pod", "service", "endpoint", "container", "node"})

# Suffixes each metric type's exposition adds (prometheus_client, OpenMetrics text 0.0.4).
SERIES_SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
    "info": ("_info",),
}


def _labels_of(registry: CollectorRegistry) -> dict[str, frozenset[str]]:
    """Label names per family name: from a labelled metric's declaration (it may have no sample
    yet), else from the samples a custom collector produced."""
    declared: dict[str, frozenset[str]] = {}
    # prometheus_client has no public view of a metric's declared label names: read the wrappers'.
    for collector in list(registry._collector_to_names):
        names = getattr(collector, "_labelnames", None)
        if names is not None:
            for family in getattr(collector, "describe")():  # noqa: B009 (Collector does not declare it)
                declared[family.name] = frozenset(names)
    for family in registry.collect():
        if family.name not in declared:
            declared[family.name] = frozenset(label for s in family.samples for label in s.labels)
    return declared


def _series(registry: CollectorRegistry) -> dict[str, frozenset[str]]:
    labels = _labels_of(registry)
    series: dict[str, frozenset[str]] = {}
    for family in registry.collect():
        for suffix in SERIES_SUFFIXES[family.type]:
            extra = {"le"} if suffix == "_bucket" else set()
            series[family.name + suffix] = labels[family.name] | extra
    return series


def extender_series(work: Path) -> dict[str, frozenset[str]]:
    inventory = profile_inventory("dgx-h100", "metrics-node")
    snapshot = work / "metrics-snapshot.json"
    items = [node_object("metrics-node", gpus=len(inventory.gpus)), inventory_object(inventory)]
    snapshot.write_text(json.dumps(cluster_list(items)))
    extender = build_snapshot_extender(snapshot)
    extender.metrics.watch_leader(lambda: True)  # as scheduler_ext.kube wires them
    extender.metrics.watch_controller_writes("kueue-check", lambda: 0)
    try:
        return _series(extender.metrics.registry)
    finally:
        extender.close()


# One row for the per-pod collector, whose label names show only in its samples.
_USAGE_ROW = PodGpuUsage(ContainerKey("ns", "pod", "main"), "GPU-0", 0, 0.5, 1, 2, (1,))


def node_agent_series() -> dict[str, frozenset[str]]:
    metrics = AgentMetrics()
    HealthMetrics(metrics.registry)
    MigMetrics(metrics.registry)
    UsageMetrics(metrics.registry, rows=lambda: (_USAGE_ROW,))  # as gpuweave/node/usage.py wires it
    return _series(metrics.registry)


def exported_series(work: Path) -> dict[str, frozenset[str]]:
    """Every series name gpuweave serves, with the label names it carries (scrape labels added)."""
    series = {**extender_series(work), **node_agent_series()}
    return {name: labels | SCRAPE_LABELS for name, labels in series.items()}


# What Prometheus writes itself for every target it scrapes (its target labels only): the rules
# that tell a component is down read them.
SCRAPE_SERIES = {"up": SCRAPE_LABELS}


def readable_series(work: Path) -> dict[str, frozenset[str]]:
    """What a rule or a panel may read: the series gpuweave exports and Prometheus' own ``up``."""
    return {**exported_series(work), **SCRAPE_SERIES}
