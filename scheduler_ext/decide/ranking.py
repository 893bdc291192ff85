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

import math
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
    fits = list(map(_FITS, verdicts))
    qualities = _qualities(verdicts, reserve)
    fitting = [q for f, q in zip(fits, qualities, strict=True) if f]
    if not fitting:
        return [0] * len(verdicts)
    if any(map(math.isnan, fitting)):  # a NaN quality: numpy's rules, as before
        ranked: list[int] = _ranks_numpy(np.array(fits, dtype=bool), np.array(qualities)).tolist()
        return ranked
    best, worst = max(fitting), min(fitting)
    step = (MAX_SCORE - 1) / (best - worst) if best > worst else 0.0
    top = MAX_SCORE - 1
    return [
        0 if not f else MAX_SCORE if best - q <= SAME else min(max(math.floor(step * (q - worst)), 0), top)
        for f, q in zip(fits, qualities, strict=True)
    ]


def ranks(verdicts: Sequence[Verdict], reserve: Sequence[float] | None = None) -> np.ndarray:
    """``ranked_scores`` as an int64 array."""
    return np.array(ranked_scores(verdicts, reserve), dtype=np.int64)


def _qualities(verdicts: Sequence[Verdict], reserve: Sequence[float] | None) -> list[float]:
    """Each verdict's quality, FGD-scored ones moved by their reservation cost. The ranking runs
    per distinct node state (tens of values), where plain lists beat numpy's per-call cost."""
    qualities = list(map(_QUALITY, verdicts))
    if reserve is None or not any(reserve):
        return qualities
    levels = np.array(list(map(_LEVEL, verdicts)), dtype=np.float64)  # None -> nan
    idle = np.array(list(map(_IDLE, verdicts)), dtype=np.float64)
    cost = np.asarray(reserve, dtype=np.float64)
    moved = (cost != 0) & ~np.isnan(levels)
    adjusted = np.array(qualities, dtype=np.float64)
    adjusted[moved] = quality_of(levels[moved] + cost[moved], idle[moved])
    out: list[float] = adjusted.tolist()
    return out


def _ranks_numpy(fits: np.ndarray, qualities: np.ndarray) -> np.ndarray:
    best, worst = qualities[fits].max(), qualities[fits].min()
    step = (MAX_SCORE - 1) / (best - worst) if best > worst else 0.0
    scaled = np.clip(np.floor(step * (qualities - worst)), 0, MAX_SCORE - 1)
    scores = np.where(best - qualities <= SAME, MAX_SCORE, scaled)
    return np.where(fits, scores, 0).astype(np.int64)
