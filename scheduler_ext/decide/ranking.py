"""Node scores kube-scheduler cannot overrule: per-request normalisation, the scorer's best = 10.

kube-scheduler adds an extender's score (0..10) times its weight times 10 to its own plugins'
scores (each 0..100 times its weight). The gpuweave-scheduler profile
(manifests/scheduler/scheduler-config.yaml) weights the extender 12, so one extender point is
worth 120, more than NodeResourcesFit's whole 0..100 range. Giving 10 to exactly the nodes the
scorer ranks best for this request, and at most 9 to every other node, therefore makes
kube-scheduler pick among the scorer's best nodes whatever its plugins say; its plugins
(MostAllocated) and its random choice only break ties among those. A node's own 0..10 score
(``Verdict.score``) stays what the filter and the tests read; prioritize answers the rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter

import numpy as np

from scheduler_ext.decide.shares import quality_of
from scheduler_ext.decide.verdict import MAX_SCORE, Verdict

_FITS, _QUALITY, _LEVEL, _IDLE = (attrgetter(a) for a in ("fits", "quality", "level", "idle"))
SAME = 1e-12  # qualities closer than this are the same (float noise of equal computations)


def ranked_scores(verdicts: Sequence[Verdict], reserve: Sequence[float] | None = None) -> list[int]:
    """0..10 per verdict: 10 for the best fitting quality, the rest scaled linearly into 0..9.

    ``reserve``: per verdict, the reservation cost in milli-GPU (``reservation``), added to the
    fragment level of FGD-scored verdicts before ranking. Not fitting: 0.
    """
    ranked: list[int] = ranks(verdicts, reserve).tolist()
    return ranked


def ranks(verdicts: Sequence[Verdict], reserve: Sequence[float] | None = None) -> np.ndarray:
    """``ranked_scores`` as an int64 array."""
    fits = np.array(list(map(_FITS, verdicts)), dtype=bool)
    qualities = np.array(list(map(_QUALITY, verdicts)), dtype=np.float64)
    if reserve is not None:
        levels = np.array(list(map(_LEVEL, verdicts)), dtype=np.float64)  # None -> nan
        idle = np.array(list(map(_IDLE, verdicts)), dtype=np.float64)
        cost = np.asarray(reserve, dtype=np.float64)
        moved = (cost != 0) & ~np.isnan(levels)
        qualities[moved] = quality_of(levels[moved] + cost[moved], idle[moved])
    if not fits.any():
        return np.zeros(len(verdicts), dtype=np.int64)
    best, worst = qualities[fits].max(), qualities[fits].min()
    step = (MAX_SCORE - 1) / (best - worst) if best > worst else 0.0
    scaled = np.clip(np.floor(step * (qualities - worst)), 0, MAX_SCORE - 1)
    scores = np.where(best - qualities <= SAME, MAX_SCORE, scaled)
    return np.where(fits, scores, 0).astype(np.int64)
