"""Network tiers from node labels: the closest tier a set of nodes shares."""

from __future__ import annotations

import pytest

from devicemodel.errors import InvalidInputError
from topology.network import (
    DEFAULT_TIER_LABELS,
    LABEL_AWS_LAYER_1,
    LABEL_AWS_LAYER_2,
    LABEL_AWS_LAYER_3,
    LABEL_GPU_CLIQUE,
    group_by_domain,
    lowest_common_tier,
    parse_tier_labels,
    tier_domain,
    tier_name,
)


def _aws(l1: str, l2: str, l3: str) -> dict[str, str]:
    return {LABEL_AWS_LAYER_1: l1, LABEL_AWS_LAYER_2: l2, LABEL_AWS_LAYER_3: l3}


def test_default_order_is_closest_first() -> None:
    assert DEFAULT_TIER_LABELS[0] == LABEL_GPU_CLIQUE
    assert DEFAULT_TIER_LABELS.index(LABEL_AWS_LAYER_3) < DEFAULT_TIER_LABELS.index(LABEL_AWS_LAYER_1)


@pytest.mark.parametrize(
    ("nodes", "expected"),
    [
        ([_aws("a", "b", "c"), _aws("a", "b", "c")], DEFAULT_TIER_LABELS.index(LABEL_AWS_LAYER_3)),
        ([_aws("a", "b", "c"), _aws("a", "b", "d")], DEFAULT_TIER_LABELS.index(LABEL_AWS_LAYER_2)),
        ([_aws("a", "b", "c"), _aws("a", "x", "d")], DEFAULT_TIER_LABELS.index(LABEL_AWS_LAYER_1)),
        ([_aws("a", "b", "c"), _aws("z", "x", "d")], len(DEFAULT_TIER_LABELS)),
        ([_aws("a", "b", "c"), {}], len(DEFAULT_TIER_LABELS)),
        ([{LABEL_GPU_CLIQUE: "nvl1", **_aws("a", "b", "c")}] * 2, 0),
        ([_aws("a", "b", "c")], DEFAULT_TIER_LABELS.index(LABEL_AWS_LAYER_3)),
    ],
)
def test_lowest_common_tier(nodes: list[dict[str, str]], expected: int) -> None:
    assert lowest_common_tier(nodes) == expected


def test_lowest_common_tier_rejects_no_nodes() -> None:
    with pytest.raises(InvalidInputError):
        lowest_common_tier([])


def test_custom_tier_labels() -> None:
    tiers = ("rack", "row")
    assert (
        lowest_common_tier([{"rack": "r1", "row": "w"}, {"rack": "r2", "row": "w"}], tier_labels=tiers) == 1
    )
    assert tier_name(1, tier_labels=tiers) == "row"
    assert tier_name(2, tier_labels=tiers) == "cluster"


def test_domains_and_groups() -> None:
    tier = DEFAULT_TIER_LABELS.index(LABEL_AWS_LAYER_3)
    assert tier_domain(_aws("a", "b", "c"), tier) == "c"
    assert tier_domain({}, tier) is None
    assert tier_domain({}, len(DEFAULT_TIER_LABELS)) == ""
    with pytest.raises(InvalidInputError):
        tier_domain({}, -1)
    groups = group_by_domain([("n1", _aws("a", "b", "c")), ("n2", _aws("a", "b", "d")), ("n3", {})], tier)
    assert groups == {"c": ["n1"], "d": ["n2"]}


def test_parse_tier_labels() -> None:
    assert parse_tier_labels(" rack , row ") == ("rack", "row")
    with pytest.raises(InvalidInputError):
        parse_tier_labels(" , ")
    with pytest.raises(InvalidInputError):
        parse_tier_labels("rack,rack")
