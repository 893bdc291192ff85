"""The gpuweave-scheduler profile's node total, as kube-scheduler computes it, for the simulation.

kube-scheduler ranks a node by the sum of its score plugins (each 0..100 times the plugin's
weight) plus each extender's score scaled to the same range (``score * weight * 100 / 10``). The
gpuweave profile (manifests/scheduler/scheduler-config.yaml) sets NodeResourcesFit to
MostAllocated, so among nodes the extender scored equally the fuller one wins. The simulation's
scheduling loop picks among nodes tied on this total, not on the extender's score alone; the
weights are read from that file, so the manifest stays the one source of truth.

Not emulated: the other default plugins (TaintToleration, NodeAffinity, PodTopologySpread,
InterPodAffinity, ImageLocality) score every simulated node alike; BalancedAllocation (weight 1)
is left out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from devicemodel.errors import GpuweaveError

SCHEDULER_CONFIG = Path(__file__).resolve().parents[2] / "manifests" / "scheduler" / "scheduler-config.yaml"
MAX_NODE_SCORE = 100  # kube-scheduler's framework.MaxNodeScore
MAX_EXTENDER_PRIORITY = 10  # extender/v1 MaxExtenderPriority


class SchedulerProfileError(GpuweaveError):
    """The scheduler configuration does not say what the simulation needs to emulate it."""


@dataclass(frozen=True)
class ProfileScoring:
    """The weights of the gpuweave-scheduler profile that decide between extender ties."""

    extender_weight: int
    fit_weight: int  # NodeResourcesFit's score-plugin weight
    fit_strategy: str
    fit_resources: tuple[tuple[str, int], ...]  # (resource name, weight) in scoringStrategy

    def most_allocated(
        self, *, requested: Mapping[str, int], allocatable: Mapping[str, int], pod: Mapping[str, int]
    ) -> int:
        """NodeResourcesFit's MostAllocated score, 0..100, with kube-scheduler's integer arithmetic.

        ``requested`` is what the node's pods request, ``pod`` what this pod adds. A resource the
        node lacks is skipped, as is an extended resource (a name with "/") the pod does not ask for.
        """
        total = weights = 0
        for name, weight in self.fit_resources:
            capacity = allocatable.get(name, 0)
            if capacity <= 0 or ("/" in name and pod.get(name, 0) == 0):
                continue
            used = min(requested.get(name, 0) + pod.get(name, 0), capacity)
            total += used * MAX_NODE_SCORE // capacity * weight
            weights += weight
        return total // weights if weights else 0

    def node_total(self, *, extender_score: int, fit_score: int) -> int:
        """The extender's part plus NodeResourcesFit's: what kube-scheduler's selectHost compares."""
        extender = extender_score * self.extender_weight * (MAX_NODE_SCORE // MAX_EXTENDER_PRIORITY)
        return extender + fit_score * self.fit_weight


def _fit_weight(profile: Mapping[str, Any]) -> int:
    plugins = profile.get("plugins") or {}
    for point in ("multiPoint", "score"):
        for plugin in (plugins.get(point) or {}).get("enabled") or []:
            if plugin.get("name") == "NodeResourcesFit" and plugin.get("weight"):
                return int(plugin["weight"])
    return 1  # kube-scheduler's default weight for NodeResourcesFit


def _scoring_strategy(profile: Mapping[str, Any]) -> Mapping[str, Any]:
    for plugin in profile.get("pluginConfig") or []:
        if plugin.get("name") == "NodeResourcesFit":
            return dict((plugin.get("args") or {}).get("scoringStrategy") or {})
    default_resources = [{"name": "cpu", "weight": 1}, {"name": "memory", "weight": 1}]
    return {"type": "LeastAllocated", "resources": default_resources}


def load_profile_scoring(
    path: Path = SCHEDULER_CONFIG, *, scheduler_name: str = "gpuweave-scheduler"
) -> ProfileScoring:
    """The profile's extender weight and NodeResourcesFit scoring, from the KubeSchedulerConfiguration."""
    try:
        config = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise SchedulerProfileError(f"cannot read scheduler configuration {path}: {error}") from error
    profiles = [p for p in config.get("profiles") or [] if p.get("schedulerName") == scheduler_name]
    # The entry GPU pods go through filters and prioritizes; an entry that only prioritizes (the
    # one for DRA claim pods) scores 0 for every pod the simulation places, so it adds nothing.
    extenders = [e for e in config.get("extenders") or [] if e.get("prioritizeVerb") and e.get("filterVerb")]
    if not profiles or len(extenders) != 1:
        raise SchedulerProfileError(
            f"{path}: expected a profile {scheduler_name!r} and one extender with filter and prioritize,"
            f" found {len(profiles)} and {len(extenders)}; fix the file or point at another"
        )
    strategy = _scoring_strategy(profiles[0])
    kind = str(strategy.get("type", "LeastAllocated"))
    if kind != "MostAllocated":
        raise SchedulerProfileError(
            f"{path}: NodeResourcesFit scores {kind}; the simulation emulates MostAllocated only"
        )
    resources = tuple((str(r["name"]), int(r.get("weight", 1))) for r in strategy.get("resources") or [])
    return ProfileScoring(
        extender_weight=int(extenders[0].get("weight", 1)),
        fit_weight=_fit_weight(profiles[0]),
        fit_strategy=kind,
        fit_resources=resources,
    )
