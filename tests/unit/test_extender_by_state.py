"""Filter's per-state work (scheduler_ext.by_state): the token table's remembered name list and
the spread of one verdict per state back to every name."""

from __future__ import annotations

import numpy as np

from scheduler_ext.by_state import Filtered, StateGroups, TokenTable
from scheduler_ext.verdict import Verdict, fail, unresolvable


def test_an_equal_list_reads_the_tokens_of_now_not_of_the_last_call() -> None:
    table = TokenTable()
    for i, name in enumerate(("a", "b", "c")):
        table.set(name, 10 + i)
    assert table.keys(["c", "a", "b"]).tolist() == [12, 10, 11]
    table.set("a", 99)  # the node's state changed after the list was remembered
    assert table.keys(["c", "a", "b"]).tolist() == [12, 99, 11]


def test_a_node_that_left_reads_minus_one_and_one_that_came_back_its_new_token() -> None:
    table = TokenTable()
    table.set("a", 1)
    table.set("b", 2)
    names = ["a", "b"]
    assert table.keys(names).tolist() == [1, 2]
    table.drop("b")
    assert table.keys(["a", "b"]).tolist() == [1, -1]
    assert "b" not in table.mapping()
    table.set("b", 7)  # back under a new slot: the remembered slots must not be used
    assert table.keys(["a", "b"]).tolist() == [1, 7]


def test_unknown_names_read_minus_one() -> None:
    table = TokenTable()
    table.set("a", 3)
    assert table.keys(["x", "a"]).tolist() == [-1, 3]


def test_slots_are_handed_out_anew_when_most_names_left() -> None:
    table = TokenTable()
    for round_ in range(5):  # 5 x 1,000 names, each round's names leaving before the next come
        names = [f"n{round_}-{i}" for i in range(1000)]
        for i, name in enumerate(names):
            table.set(name, i)
        assert table.keys(names).tolist() == list(range(1000))
        for name in names[1:]:
            table.drop(name)
    assert table.keys(["n4-0", "n3-0", "n0-0"]).tolist() == [0, 0, 0]
    assert len(table.mapping()) == 5


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
