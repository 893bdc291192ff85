"""Filter's rejected names: the JSON written per state decodes to the name -> reason map, for any
names (quotes, backslashes, control characters, non-ASCII, repeats) and any reasons."""

from __future__ import annotations

import numpy as np
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_ext.decide.by_state import RejectedNames
from scheduler_ext.serving.server import encode_filter_result
from scheduler_ext.serving.wire import ExtenderFilterResult


def _rejected(names: list[str], states: list[int], reasons: list[str], mask: list[bool]) -> RejectedNames:
    return RejectedNames(names, np.array(mask, dtype=bool), np.array(states, dtype=np.int64), reasons)


def _expected(names: list[str], states: list[int], reasons: list[str], mask: list[bool]) -> dict[str, str]:
    return {n: reasons[s] for n, s, m in zip(names, states, mask, strict=True) if m}


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 4).flatmap(
        lambda k: st.tuples(
            st.lists(st.text(max_size=6), max_size=12).flatmap(
                lambda names: st.tuples(
                    st.just(names),
                    st.lists(st.integers(0, k - 1), min_size=len(names), max_size=len(names)),
                    st.lists(st.booleans(), min_size=len(names), max_size=len(names)),
                )
            ),
            st.lists(st.text(max_size=8), min_size=k, max_size=k),
        )
    )
)
def test_the_json_is_the_map(case: tuple[tuple[list[str], list[int], list[bool]], list[str]]) -> None:
    (names, states, mask), reasons = case
    # a name's state is fixed (equal names share a token): the first occurrence's state counts for all
    first: dict[str, int] = {}
    states = [first.setdefault(n, s) for n, s in zip(names, states, strict=True)]
    rejected = _rejected(names, states, reasons, mask)
    expected = _expected(names, states, reasons, mask)
    assert orjson.loads(rejected.json()) == expected
    assert rejected == expected and dict(rejected) == expected and len(rejected) == len(expected)
    assert bool(rejected) == bool(expected)


def test_plain_names_take_the_per_state_path_and_keep_their_reasons() -> None:
    names = [f"node-{i}" for i in range(10)]
    states = [i % 3 for i in range(10)]
    reasons = ['needs 8 "whole" GPUs', "no\\share", "ünïcode"]
    mask = [i != 4 for i in range(10)]
    rejected = _rejected(names, states, reasons, mask)
    assert orjson.loads(rejected.json()) == _expected(names, states, reasons, mask)
    assert rejected.json().startswith(b'{"node-0":"needs 8 \\"whole\\" GPUs","node-3":')  # grouped per state
    assert _rejected(names, states, reasons, [False] * 10).json() == b"{}"
    assert _rejected(names[:1], [0], reasons, [True]).json() == b'{"node-0":"needs 8 \\"whole\\" GPUs"}'


def test_the_filter_answer_carries_both_maps() -> None:
    names = ["a", "b", "c"]
    failed = _rejected(names, [0, 1, 1], ["x", "y"], [True, False, False])
    hopeless = _rejected(names, [0, 1, 1], ["x", "y"], [False, True, True])
    result = ExtenderFilterResult.model_construct(
        NodeNames=[], FailedNodes=failed, FailedAndUnresolvableNodes=hopeless, Nodes=None, Error=""
    )
    assert orjson.loads(encode_filter_result(result)) == {
        "Nodes": None,
        "NodeNames": [],
        "FailedNodes": {"a": "x"},
        "FailedAndUnresolvableNodes": {"b": "y", "c": "y"},
        "Error": "",
    }


def test_names_holding_commas_keep_their_separators() -> None:
    # a name "," encodes as '","', the separator's own bytes (found by the property test above)
    cases = [[","], [",", "y"], ["x", ","], ["a,", "b"], ["", ","], [",,", ",", "z"]]
    for names in cases:
        mask = [True] * len(names)
        rejected = _rejected(names, [0] * len(names), ["full"], mask)
        assert orjson.loads(rejected.json()) == dict.fromkeys(names, "full"), names
