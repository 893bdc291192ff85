"""go-gpuallocator's own test cases (tests/fixtures/go_gpuallocator/cases.yaml) against our port.

Each case runs twice where it can: on the fixture's own pair scores (its links, transcribed), and
for the best-effort policy also through ``go_gpuallocator_like`` on the fixture's machine as a node
profile (tests/fixtures/go_gpuallocator/profiles), i.e. with the scores our topology graph gives.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from hardware.profiles import load_profile
from topology.baselines import go_gpuallocator_like, go_gpuallocator_links
from topology.go_gpuallocator import (
    DGX1_PASCAL_SETS,
    DGX1_VOLTA_SETS,
    PCIE_LINK_POINTS,
    ScoreMatrix,
    Slot,
    best_effort,
    gpu_sets,
    pair_points,
    partitions,
    simple,
    static_sets,
)
from topology.graph import TopologyGraph

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "go_gpuallocator"
CASES: dict[str, Any] = yaml.safe_load((FIXTURES / "cases.yaml").read_text(encoding="utf-8"))
Policy = Callable[[ScoreMatrix, Sequence[int], Collection[int], int], tuple[Slot, ...]]
POLICIES: dict[str, Policy] = {
    "best-effort": lambda s, a, r, n: best_effort(s, available=a, required=r, size=n),
    "simple": lambda s, a, r, n: simple(available=a, required=r, size=n),
    "static-dgx1-pascal": lambda s, a, r, n: static_sets(DGX1_PASCAL_SETS, available=a, required=r, size=n),
    "static-dgx1-volta": lambda s, a, r, n: static_sets(DGX1_VOLTA_SETS, available=a, required=r, size=n),
}


def fixture_links(machine: str) -> dict[tuple[int, int], list[str]]:
    links: dict[tuple[int, int], list[str]] = {}
    for a, b, kind in CASES["machines"][machine]["links"]:
        links.setdefault((a, b), []).append(kind)
    return links


@cache
def fixture_scores(machine: str) -> ScoreMatrix:
    """Pair scores from the fixture's links; its allocator refuses a pair listed unevenly."""
    links = fixture_links(machine)
    count = CASES["machines"][machine]["gpus"]
    for a, b in itertools.permutations(range(count), 2):
        assert len(links.get((a, b), [])) == len(links.get((b, a), [])), (machine, a, b)
    return tuple(tuple(pair_points(links.get((a, b), [])) for b in range(count)) for a in range(count))


@cache
def profile_graph(machine: str) -> TopologyGraph:
    profile = load_profile(FIXTURES / "profiles" / f"{machine}.yaml")
    return TopologyGraph.from_inventory(profile.to_inventory())


def policy_cases() -> list[Any]:
    return [pytest.param(group["policy"], group["machine"], case, id=f"{group['test']}/{case['description']}")
            for group in CASES["policyCases"] for case in group["cases"]]


def allocator_cases(policy: str | None = None) -> list[Any]:
    return [pytest.param(case, id=case["test"]) for case in CASES["allocatorCases"]
            if policy is None or case["policy"] == policy]


def test_every_case_of_the_source_is_here() -> None:
    counts = {group["test"]: len(group["cases"]) for group in CASES["policyCases"]}
    assert counts == {"TestBestEffortAllocate": 11, "TestSimpleAllocate": 14, "TestStaticDGX1VoltAllocate": 7}
    assert len(CASES["allocatorCases"]) == 21  # 11 best-effort, 10 static
    assert {name: len(m["links"]) for name, m in CASES["machines"].items()} == {
        "rtx8000-4": 12, "dgx1-pascal": 88, "dgx1-volta": 88}


@pytest.mark.parametrize(("policy", "machine", "case"), policy_cases())
def test_policy_case_on_the_fixture_scores(policy: str, machine: str, case: dict[str, Any]) -> None:
    got = POLICIES[policy](fixture_scores(machine), case["available"], case["required"], case["size"])
    assert sorted(got, key=str) == sorted(case["result"])


@pytest.mark.parametrize("case", allocator_cases())
def test_allocator_case_on_the_fixture_scores(case: dict[str, Any]) -> None:
    scores = fixture_scores(case["machine"])
    free = set(range(len(scores)))
    for size, expected in case["steps"]:
        got = POLICIES[case["policy"]](scores, sorted(free), (), size)
        assert sorted(got, key=str) == sorted(expected), (size, sorted(free))
        free -= {d for d in got if d is not None}


@pytest.mark.parametrize(("policy", "machine", "case"),
                         [p for p in policy_cases() if p.values[0] == "best-effort"])
def test_best_effort_case_on_the_profile(policy: str, machine: str, case: dict[str, Any]) -> None:
    got = go_gpuallocator_like(profile_graph(machine), available=frozenset(case["available"]),
                               size=case["size"], must_include=frozenset(case["required"]))
    assert got == (tuple(sorted(case["result"])) or None)  # None: it allocates nothing


@pytest.mark.parametrize("case", allocator_cases("best-effort"))
def test_best_effort_allocator_case_on_the_profile(case: dict[str, Any]) -> None:
    graph = profile_graph(case["machine"])
    free = set(graph.gpu_indices)
    for size, expected in case["steps"]:
        got = go_gpuallocator_like(graph, available=frozenset(free), size=size)
        assert got == (tuple(sorted(expected)) or None), (size, sorted(free))
        free -= set(got or ())


@pytest.mark.parametrize("machine", sorted(CASES["machines"]))
def test_profiles_give_the_fixture_links(machine: str) -> None:
    """Every link the fixture lists, from the profile; the fixture leaves out the PCIe link of the
    RTX 8000's bridged pairs (NVML reports one for every pair), so there only NVLink is compared."""
    graph = profile_graph(machine)
    for (a, b), listed in fixture_links(machine).items():
        ours = list(go_gpuallocator_links(graph, a, b))
        if not any(kind in PCIE_LINK_POINTS for kind in listed):
            ours = [kind for kind in ours if kind not in PCIE_LINK_POINTS]
        assert sorted(ours) == sorted(listed), (a, b)
    assert len({frozenset(pair) for pair in fixture_links(machine)}) == len(graph.gpu_indices) * (
        len(graph.gpu_indices) - 1) // 2


@pytest.mark.parametrize("case", CASES["iterateSets"], ids=lambda c: c["description"])
def test_iterate_sets(case: dict[str, Any]) -> None:
    got = sorted(sorted(s) for s in gpu_sets(case["input"], case["size"]))
    assert got == sorted(sorted(s) for s in case["result"])


@pytest.mark.parametrize("case", CASES["iteratePartitions"], ids=lambda c: c["description"])
def test_iterate_partitions(case: dict[str, Any]) -> None:
    def canonical(partition: Sequence[Sequence[Slot]]) -> list[list[str]]:
        return sorted(sorted(str(slot) for slot in group) for group in partition)

    got = sorted(canonical(p) for p in partitions(case["input"], case["size"]))
    assert got == sorted(canonical(p) for p in case["result"])
