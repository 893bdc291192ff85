"""Prioritize's ranks: the list arithmetic matches the array arithmetic it replaced, value for value."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_ext.decide.ranking import MAX_SCORE, ranked_scores, ranks
from scheduler_ext.decide.shares import quality_of
from scheduler_ext.decide.verdict import Verdict

qualities = st.one_of(st.sampled_from([0.0, 0.5, 1.0, 0.1 + 0.2, 0.3]), st.floats(0.0, 1.0))
verdicts = st.lists(
    st.builds(
        Verdict,
        fits=st.booleans(),
        quality=qualities,
        level=st.one_of(st.none(), st.floats(0.0, 8000.0)),
        idle=st.floats(0.0, 8000.0),
    ),
    max_size=40,
)


def reference(found: list[Verdict], reserve: list[float] | None) -> list[int]:
    """The array form: per-verdict arrays, reservation applied to FGD-scored qualities, scaled."""
    fits = np.array([v.fits for v in found], dtype=bool)
    quality = np.array([v.quality for v in found], dtype=np.float64)
    if reserve is not None:
        levels = np.array([v.level for v in found], dtype=np.float64)
        idle = np.array([v.idle for v in found], dtype=np.float64)
        cost = np.asarray(reserve, dtype=np.float64)
        moved = (cost != 0) & ~np.isnan(levels)
        quality[moved] = quality_of(levels[moved] + cost[moved], idle[moved])
    if not fits.any():
        return [0] * len(found)
    best, worst = quality[fits].max(), quality[fits].min()
    with np.errstate(all="ignore"):  # qualities a subnormal apart: every value masked below
        step = (MAX_SCORE - 1) / (best - worst) if best > worst else 0.0
        scaled = np.clip(np.floor(step * (quality - worst)), 0, MAX_SCORE - 1)
        scores = np.where(best - quality <= 1e-12, MAX_SCORE, scaled)
        out: list[int] = np.where(fits, scores, 0).astype(np.int64).tolist()
    return out


@settings(max_examples=300, deadline=None)
@given(found=verdicts, data=st.data())
def test_ranks_equal_the_array_arithmetic(found: list[Verdict], data: st.DataObject) -> None:
    reserve = data.draw(
        st.one_of(
            st.none(),
            st.lists(st.sampled_from([0.0, 125.0, 500.0]), min_size=len(found), max_size=len(found)),
        )
    )
    expected = reference(found, reserve)
    assert ranked_scores(found, reserve) == expected
    assert ranks(found, reserve).tolist() == expected
    assert ranks(found, reserve).dtype == np.int64


def test_best_fitting_quality_gets_ten_and_the_rest_scale_below_it() -> None:
    found = [
        Verdict(fits=True, quality=1.0),
        Verdict(fits=True, quality=0.5),
        Verdict(fits=True, quality=0.75),
        Verdict(fits=False, quality=1.0),
    ]
    assert ranked_scores(found) == [MAX_SCORE, 0, 4, 0]  # 0.75: 9 * 0.25 / 0.5 = 4.5, floored
    assert ranked_scores([Verdict(fits=False)]) == [0]
