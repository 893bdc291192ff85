"""Which broken nodes are handed to their engine: verdicts, opt-out, budgets, the cap, the order."""

from __future__ import annotations

import pytest

from gpuweave.lifecycle.replace import (
    Act,
    Engine,
    EngineHandle,
    NodeFacts,
    PodFacts,
    ReplacementPolicy,
    decide,
    disruption_cap,
)
from gpuweave.lifecycle.selectors import selects

CLAIM = EngineHandle(Engine.KARPENTER, "gpu-abcde")


def node(
    name: str, verdict: str = "ReplaceRequired", *, pods: tuple[PodFacts, ...] = (), handed: bool = False
) -> NodeFacts:
    return NodeFacts(
        name, verdict, "GPU-1: Xid 79", EngineHandle(Engine.KARPENTER, f"claim-{name}"), pods, handed
    )


def acts(decisions: tuple[object, ...]) -> dict[str, str]:
    return {d.node: d.act.value for d in decisions}  # type: ignore[attr-defined]


def test_a_node_to_replace_is_handed_over_with_its_nodeclaim() -> None:
    (decision,) = decide([node("n1")], nodes_total=10, policy=ReplacementPolicy())
    assert decision.act is Act.HAND_OVER
    assert decision.handle == EngineHandle(Engine.KARPENTER, "claim-n1")
    assert "replacement required (GPU-1: Xid 79)" in decision.reason
    assert "NodeClaim claim-n1" in decision.reason


@pytest.mark.parametrize(("reboot", "act"), [("replace", Act.HAND_OVER), ("leave", Act.LEAVE)])
def test_a_reboot_is_a_replacement_unless_a_reboot_path_is_configured(reboot: str, act: Act) -> None:
    policy = ReplacementPolicy(reboot=reboot)  # type: ignore[arg-type]
    (decision,) = decide([node("n1", "RebootRequired")], nodes_total=10, policy=policy)
    assert decision.act is act


def test_an_opted_out_pod_holds_its_node_and_says_which() -> None:
    pods = (PodFacts("team/train-0", opted_out=True), PodFacts("team/other"))
    (decision,) = decide([node("n1", pods=pods)], nodes_total=10, policy=ReplacementPolicy())
    assert decision.act is Act.WAIT
    assert "team/train-0" in decision.reason and "team/other" not in decision.reason


def test_a_budget_that_allows_no_eviction_holds_the_node_unless_overridden() -> None:
    pods = (PodFacts("team/db-0", pdb_blocking="db-pdb"),)
    (held,) = decide([node("n1", pods=pods)], nodes_total=10, policy=ReplacementPolicy())
    assert held.act is Act.WAIT and "db-pdb" in held.reason
    (forced,) = decide([node("n1", pods=pods)], nodes_total=10, policy=ReplacementPolicy(pdb_override=True))
    assert forced.act is Act.HAND_OVER


def test_the_cap_counts_nodes_handed_over_earlier_and_prefers_replacement_to_reboot() -> None:
    candidates = [
        node("a-reboot", "RebootRequired"),
        node("z-replace"),
        node("b-old", handed=True),
        node("c-replace"),
    ]
    # 20 GPU nodes x 0.15 -> cap 3: b-old holds one place, so two more go now
    decisions = decide(candidates, nodes_total=20, policy=ReplacementPolicy(cap_fraction=0.15))
    assert acts(decisions) == {
        "b-old": "hand-over",
        "c-replace": "hand-over",
        "z-replace": "hand-over",
        "a-reboot": "wait",
    }
    waiting = next(d for d in decisions if d.node == "a-reboot")
    assert "disruption cap reached: 3 of 20 GPU nodes handed over, cap 3" in waiting.reason


def test_a_held_node_takes_no_place_under_the_cap() -> None:
    held = node("a", pods=(PodFacts("ns/p", opted_out=True),))
    decisions = decide([held, node("b")], nodes_total=5, policy=ReplacementPolicy(cap_fraction=0.1))
    assert acts(decisions) == {"a": "wait", "b": "hand-over"}


def test_a_node_that_asks_nothing_of_the_engine_is_left() -> None:
    (decision,) = decide([node("n1", "Serviceable")], nodes_total=5, policy=ReplacementPolicy())
    assert decision.act is Act.LEAVE


@pytest.mark.parametrize(
    ("fraction", "total", "cap"), [(0.1, 0, 1), (0.1, 5, 1), (0.1, 11, 2), (0.5, 4, 2), (1.0, 3, 3)]
)
def test_disruption_cap(fraction: float, total: int, cap: int) -> None:
    assert disruption_cap(fraction, total) == cap


def test_the_engine_handle_says_what_is_deleted() -> None:
    assert EngineHandle(Engine.CLUSTER_API, "m-1", "capi").describe() == "Machine capi/m-1"
    assert CLAIM.describe() == "NodeClaim gpu-abcde"
    assert "condition only" in EngineHandle(Engine.CONDITION).describe()


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        (None, {"app": "db"}, False),
        ({}, {"app": "db"}, True),
        ({"matchLabels": {"app": "db"}}, {"app": "db", "x": "y"}, True),
        ({"matchLabels": {"app": "db"}}, {"app": "web"}, False),
        (
            {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}]},
            {"tier": "b"},
            True,
        ),
        ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["a"]}]}, {}, True),
        ({"matchExpressions": [{"key": "tier", "operator": "Exists"}]}, {}, False),
        ({"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}, {}, True),
        ({"matchExpressions": [{"key": "tier", "operator": "Sideways"}]}, {"tier": "a"}, False),
    ],
)
def test_label_selectors_select_as_the_api_does(
    selector: dict[str, object] | None, labels: dict[str, str], expected: bool
) -> None:
    assert selects(selector, labels) is expected
