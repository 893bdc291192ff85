"""Which fitting nodes filter passes on: the best few, when kube-scheduler's own scoring cannot
overrule the extender's ranking for this pod.

kube-scheduler scores every node filter passes with its Score plugins, then sends all of them to
prioritize, and with ``percentageOfNodesToScore: 100`` that is every feasible node in the cluster:
at 1,000 nodes that work, twice over HTTP, costs more CPU per pod than the whole scheduling cycle
without an extender. Yet it rarely changes the choice: prioritize gives 10 only to the nodes the
scorer ranks best and one step is worth more than NodeResourcesFit (``ranking``). So filter keeps
the ``keep`` best-ranked fitting nodes; equal ranks go to the fuller node first (what the
profile's MostAllocated would pick among them), then to a per-pod random order (kube-scheduler's
own random choice among equals). Nodes left out are neither failed nor reported: kube-scheduler
drops a node the extender does not return.

Pods whose spec asks kube-scheduler to weigh a soft preference (preferred node affinity, preferred
pod affinity or anti-affinity, ScheduleAnyway spread constraints) get every fitting node: there a
plugin may rightly outvote a small topology gain, and it can only do so over nodes it sees.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

DEFAULT_KEEP = 32
_PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"


def weighs_soft_preferences(pod: Mapping[str, Any]) -> bool:
    """Whether kube-scheduler's Score plugins hold a per-pod preference the extender does not see."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return False
    affinity = spec.get("affinity")
    if isinstance(affinity, Mapping):
        for kind in ("nodeAffinity", "podAffinity", "podAntiAffinity"):
            section = affinity.get(kind)
            if isinstance(section, Mapping) and section.get(_PREFERRED):
                return True
    for constraint in spec.get("topologySpreadConstraints") or ():
        if isinstance(constraint, Mapping) and constraint.get("whenUnsatisfiable") == "ScheduleAnyway":
            return True
    return False


def shortlist(
    names: Sequence[str], ranks: Sequence[int], fullness: Sequence[int], *, keep: int, seed: str
) -> list[str]:
    """The ``keep`` names with the highest rank; ties: higher fullness, then a random order fixed
    by ``seed`` (the pod). All names when there are no more than ``keep``."""
    if keep <= 0 or len(names) <= keep:
        return list(names)
    rng = np.random.default_rng(zlib.crc32(seed.encode()))
    order = np.lexsort(
        (rng.random(len(names)), -np.asarray(fullness, dtype=np.int64), -np.asarray(ranks, dtype=np.int64))
    )
    return [names[i] for i in order[:keep].tolist()]
