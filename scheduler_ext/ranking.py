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

from scheduler_ext.shares import quality_of
from scheduler_ext.verdict import MAX_SCORE, Verdict

SAME = 1e-12  # qualities closer than this are the same (float noise of equal computations)


def ranked_scores(verdicts: Sequence[Verdict], reserve: Sequence[float] | None = None) -> list[int]:
    """0..10 per verdict: 10 for the best fitting quality, the rest scaled linearly into 0..9.

    ``reserve``: per verdict, the reservation cost in milli-GPU (``reservation``), added to the
    fragment level of FGD-scored verdicts before ranking. Not fitting: 0.
    """
    fits = [v.fits for v in verdicts]
    qualities = [v.quality for v in verdicts]
    if reserve is not None:
        qualities = [
            quality_of(v.level + cost, v.idle) if cost and v.level is not None else q
            for v, q, cost in zip(verdicts, qualities, reserve, strict=True)
        ]
    fitting = [q for q, f in zip(qualities, fits, strict=True) if f]
    if not fitting:
        return [0] * len(verdicts)
    best, worst = max(fitting), min(fitting)
    step = (MAX_SCORE - 1) / (best - worst) if best > worst else 0.0
    return [
        (MAX_SCORE if best - q <= SAME else max(0, min(MAX_SCORE - 1, math.floor(step * (q - worst)))))
        if f
        else 0
        for q, f in zip(qualities, fits, strict=True)
    ]
