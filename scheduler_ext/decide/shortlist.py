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

import math
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
    names: Sequence[str],
    ranks: Sequence[int] | np.ndarray,
    fullness: Sequence[int] | np.ndarray,
    *,
    keep: int,
    seed: str,
) -> list[str]:
    """The ``keep`` names with the highest rank, best first; ties: higher fullness, then an order
    fixed by ``seed`` (the pod). All names, in their order, when there are no more than ``keep``.

    One int64 key per name (rank, then fullness, then a per-seed permutation of the positions) and
    a partial sort: at 15,000 names a full lexsort would cost more than the rest of filter."""
    count = len(names)
    if keep <= 0 or count <= keep:
        return list(names)
    digest = zlib.crc32(seed.encode())
    stride = _coprime_stride(count, 1 + digest % count)
    order = (np.arange(count, dtype=np.int64) * stride + (digest >> 8)) % count  # a permutation
    full = np.minimum(np.asarray(fullness, dtype=np.int64), _FULLNESS_CAP)
    key = (np.asarray(ranks, dtype=np.int64) * (_FULLNESS_CAP + 1) + full) * count + order
    best = np.argpartition(-key, keep - 1)[:keep]
    best = best[np.argsort(-key[best], kind="stable")]
    return [names[i] for i in best.tolist()]


_FULLNESS_CAP = 4095  # devices held per node that still order ties (more ties as equally full)


def _coprime_stride(count: int, start: int) -> int:
    """The first stride from ``start`` that shares no factor with ``count`` (so i*stride mod count
    visits every position once)."""
    stride = start
    while math.gcd(stride, count) != 1:
        stride = stride % count + 1
    return stride
