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

from scheduler_ext.verdict import MAX_SCORE, Verdict

SAME = 1e-12  # qualities closer than this are the same (float noise of equal computations)


def ranked_scores(verdicts: Sequence[Verdict]) -> list[int]:
    """0..10 per verdict: 10 for the best fitting quality, the rest scaled linearly into 0..9."""
    qualities = [v.quality for v in verdicts if v.fits]
    if not qualities:
        return [0] * len(verdicts)
    best, worst = max(qualities), min(qualities)
    spread = best - worst
    scores = []
    for verdict in verdicts:
        if not verdict.fits:
            scores.append(0)
        elif best - verdict.quality <= SAME:
            scores.append(MAX_SCORE)
        else:
            scaled = math.floor((MAX_SCORE - 1) * (verdict.quality - worst) / spread)
            scores.append(max(0, min(MAX_SCORE - 1, scaled)))
    return scores
