"""Filter's per-state work (scheduler_ext.decide.by_state): names grouped by state, and one verdict per
state spread back to every name as one verdict per node would answer."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_ext.decide.by_state import Filtered, StateGroups, TokenIndex, _distinct
from scheduler_ext.decide.verdict import Verdict, fail, unresolvable


def test_the_index_reads_each_names_token_of_now_in_any_order() -> None:
    index = TokenIndex()
    names = [f"node-{i:05d}" for i in range(500)]
    for i, name in enumerate(names):
        index.set(name, 1000 + i)
    shuffled = [names[(i * 7919) % 500] for i in range(500)]  # another order, same names
    assert index.keys(shuffled).tolist() == [index.mapping()[n] for n in shuffled]
    index.set(names[3], 7)  # a token change after the table was built is written in place
    assert index.keys([names[3], names[4]]).tolist() == [7, 1004]


def test_the_index_follows_names_that_come_and_go() -> None:
    index = TokenIndex()
    index.set("a", 1)
    index.set("b", 2)
    assert index.keys(["b", "a", "x"]).tolist() == [2, 1, -1]
    index.drop("b")
    index.set("c", 3)
    assert index.keys(["a", "b", "c"]).tolist() == [1, -1, 3]
    assert dict(index.mapping()) == {"a": 1, "c": 3}
    index.drop("a")
    index.drop("c")
    assert index.keys(["a", "c"]).tolist() == [-1, -1]


def test_groups_give_each_missing_name_a_state_of_its_own() -> None:
    groups = StateGroups.of(np.array([5, -1, 5, 2, -1], dtype=np.int64))
    assert groups.tokens.count(None) == 2
    states = groups.inverse.tolist()
    assert states[0] == states[2]
    assert states[1] != states[4]
    # states in key order: the missing names' own keys (-5, -2) first, then tokens 2 and 5
    assert groups.representatives(["a", "b", "c", "d", "e"]) == ["e", "b", "d", "a"]
    assert groups.tokens == [None, None, 2, 5]


def test_spread_answers_as_one_verdict_per_node_would() -> None:
    names = [f"n{i}" for i in range(9)]
    tokens = np.array([3, 1, 2, 3, 1, 2, 3, -1, 1], dtype=np.int64)
    groups = StateGroups.of(tokens)
    per_token: dict[int | None, Verdict] = {
        1: Verdict(fits=True, score=5),
        2: fail("2 GPUs free, 4 asked"),
        3: unresolvable("no GPU matches the selector"),
        None: fail("node n7 is not (yet) in the gpuweave extender's cache"),
    }
    verdicts = [per_token[t] for t in groups.tokens]
    spread = Filtered.spread(names, groups, verdicts)
    expected = [per_token[None if t < 0 else int(t)] for t in tokens.tolist()]
    assert spread.fits.tolist() == [v.fits for v in expected]
    pairs = list(zip(names, expected, strict=True))
    assert spread.failed == {n: v.reason for n, v in pairs if not v.fits and not v.unresolvable}
    assert spread.hopeless == {n: v.reason for n, v in pairs if v.unresolvable}
    counted: dict[str, int] = {}
    for _, v in pairs:
        if not v.fits:
            counted[v.reason] = counted.get(v.reason, 0) + 1
    assert spread.rejected == counted


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.integers(-20, 200), st.integers(0, 10**9)), max_size=60))
def test_grouping_is_numpys_unique_for_narrow_and_wide_token_ranges(values: list[int]) -> None:
    keys = np.array(values, dtype=np.int64)
    unique, inverse = _distinct(keys)
    expected, expected_inverse = np.unique(keys, return_inverse=True)
    assert unique.tolist() == expected.tolist()
    assert inverse.tolist() == expected_inverse.reshape(-1).tolist()
