"""Planner tables over every catalogued GPU: every valid layout is planned, every invalid one explained.

The set of valid layouts is enumerated here independently of the planner, by walking every
non-overlapping choice of placements that respects max counts and compute slices.
"""

from __future__ import annotations

from collections import Counter
from itertools import combinations_with_replacement

import pytest

from hardware.mig_catalog import GpuModel, default_catalog
from mig.planner import Instance, MigPlanError, Plan, TargetEntry, plan_demand, plan_layout

CATALOG = default_catalog()
H100 = CATALOG.model("H100-80GB")
A100 = CATALOG.model("A100-SXM4-40GB")


def valid_layouts(model: GpuModel) -> set[tuple[str, ...]]:
    """Every multiset of profiles that some non-overlapping placement realises."""
    placements = [(p, s) for p in model.profiles for s in p.starts]
    found: set[tuple[str, ...]] = set()

    def walk(i: int, mask: int, chosen: list[str], compute: int) -> None:
        found.add(tuple(sorted(chosen)))
        for j in range(i, len(placements)):
            profile, start = placements[j]
            bits = ((1 << profile.memory_slices) - 1) << start
            counts = Counter(chosen)
            if mask & bits or counts[profile.name] >= profile.max_count:
                continue
            if compute + profile.compute_slices > model.compute_slices:
                continue
            walk(j + 1, mask | bits, [*chosen, profile.name], compute + profile.compute_slices)

    walk(0, 0, [], 0)
    return found


def assert_plan_realises(model: GpuModel, plan: Plan, wanted: tuple[str, ...]) -> None:
    assert tuple(sorted(p.profile for p in plan.final)) == tuple(sorted(wanted))
    mask = 0
    for planned in plan.final:
        profile = model.profile(planned.profile)
        assert planned.start in profile.starts
        assert planned.size == profile.memory_slices
        assert not mask & planned.placement.mask
        mask |= planned.placement.mask


@pytest.mark.parametrize("model", CATALOG.models, ids=lambda m: m.key)
def test_every_valid_layout_is_planned_with_explicit_placements(model):
    layouts = valid_layouts(model)
    assert len(layouts) > 10
    for layout in layouts:
        plan = plan_layout(model, [], list(layout))
        assert_plan_realises(model, plan, layout)
        assert not plan.destroy and len(plan.create) == len(layout)


@pytest.mark.parametrize("model", CATALOG.models, ids=lambda m: m.key)
def test_every_invalid_layout_gets_a_reason(model):
    layouts = valid_layouts(model)
    names = [p.name for p in model.profiles]
    invalid = 0
    for size in range(1, model.memory_slices + 2):
        for combo in combinations_with_replacement(names, size):
            if tuple(sorted(combo)) in layouts:
                continue
            invalid += 1
            with pytest.raises(MigPlanError) as caught:
                plan_layout(model, [], list(combo))
            message = str(caught.value)
            assert model.key in message or "max count" in message
            assert "\n" not in message
    assert invalid > 0


@pytest.mark.parametrize("model", CATALOG.models, ids=lambda m: m.key)
def test_every_valid_layout_is_reachable_from_the_full_gpu_idle(model):
    full = max(model.profiles, key=lambda p: p.memory_slices)
    current = [Instance(full.name, 0, full.memory_slices, key="gi-0")]
    for layout in valid_layouts(model):
        plan = plan_layout(model, current, list(layout))
        assert_plan_realises(model, plan, layout)
        if layout == (full.name,):
            assert plan.is_noop
        else:
            assert plan.destroy == tuple(current)


def test_two_3g_take_both_halves():
    plan = plan_layout(H100, [], ["3g.40gb", "3g.40gb"])
    assert [(p.profile, p.start, p.size) for p in plan.final] == [("3g.40gb", 0, 4), ("3g.40gb", 4, 4)]


def test_small_instance_fills_from_the_high_end():
    plan = plan_layout(H100, [], ["1g.10gb"])
    assert [(p.start, p.size) for p in plan.create] == [(6, 1)]
    plan = plan_layout(H100, [], ["2g.20gb", "1g.10gb"])
    assert sorted((p.profile, p.start) for p in plan.final) == [("1g.10gb", 6), ("2g.20gb", 4)]


def test_busy_instance_is_kept_and_idle_matching_one_too():
    current = [Instance("3g.40gb", 0, 4, busy=True, key="a"), Instance("3g.40gb", 4, 4, key="b")]
    plan = plan_layout(H100, current, ["3g.40gb", "3g.40gb"])
    assert plan.is_noop and {i.key for i in plan.keep} == {"a", "b"}


def test_idle_instance_not_in_target_is_destroyed_busy_kept():
    current = [Instance("3g.40gb", 0, 4, busy=True, key="a"), Instance("3g.40gb", 4, 4, key="b")]
    plan = plan_layout(H100, current, ["3g.40gb", "1g.10gb", "1g.10gb", "1g.10gb"])
    assert [i.key for i in plan.keep] == ["a"]
    assert [i.key for i in plan.destroy] == ["b"]
    assert sorted(p.start for p in plan.create) == [4, 5, 6]


def test_idle_instance_in_the_way_moves_rather_than_blocks():
    current = [Instance("1g.10gb", 0, 1, key="x")]
    plan = plan_layout(H100, current, ["4g.40gb", "1g.10gb"])
    assert [i.key for i in plan.destroy] == ["x"]
    assert sorted((p.profile, p.start) for p in plan.final) == [("1g.10gb", 6), ("4g.40gb", 0)]


@pytest.mark.parametrize(
    ("current", "target", "reason"),
    [
        (
            [Instance("3g.40gb", 0, 4, busy=True)],
            ["7g.80gb"],
            "busy instance 3g.40gb at slots 0-3 blocks 7g.80gb",
        ),
        (
            [Instance("3g.40gb", 0, 4, busy=True)],
            ["3g.40gb", "4g.40gb"],
            "busy instance 3g.40gb at slots 0-3 blocks 4g.40gb",
        ),
        ([], ["4g.40gb", "4g.40gb"], "profile 4g.40gb max count 1"),
        ([], ["7g.80gb", "1g.10gb"], r"needs 9 memory slices; the GPU \(H100-80GB\) has 8"),
        ([], ["4g.40gb", "2g.20gb", "2g.20gb"], "needs 8 compute slices"),
        ([], [TargetEntry("3g.40gb", 2)], "placement start 2 is not valid for 3g.40gb"),
        (
            [Instance("2g.20gb", 2, 2, busy=True)],
            ["1g.10gb"],
            "busy instance 2g.20gb at slots 2-3 is not in the target",
        ),
    ],
)
def test_impossible_targets_name_the_blocker(current, target, reason):
    with pytest.raises(MigPlanError, match=reason):
        plan_layout(H100, current, target)


def test_pinned_start_is_honoured():
    plan = plan_layout(H100, [], [TargetEntry("1g.10gb", 0), TargetEntry("3g.40gb", 4)])
    assert sorted((p.profile, p.start) for p in plan.final) == [("1g.10gb", 0), ("3g.40gb", 4)]


def test_unknown_profile_is_reported():
    with pytest.raises(MigPlanError, match="not offered by A100-SXM4-40GB"):
        plan_layout(A100, [], ["3g.40gb"])


def test_demand_adds_what_fits_around_busy_instances():
    current = [Instance("3g.40gb", 0, 4, busy=True, key="a")]
    plan = plan_demand(H100, current, {"1g.10gb": 5})
    assert [i.key for i in plan.keep] == ["a"]
    assert sorted(p.start for p in plan.create) == [4, 5, 6]


def test_demand_counts_idle_instances_and_destroys_the_unrequested_one_in_the_way():
    current = [Instance("1g.10gb", 6, 1, key="idle-1g"), Instance("2g.20gb", 0, 2, key="idle-2g")]
    plan = plan_demand(H100, current, {"1g.10gb": 1, "3g.40gb": 1})
    assert [i.key for i in plan.keep] == ["idle-1g"]
    assert [i.key for i in plan.destroy] == ["idle-2g"]
    assert [(p.profile, p.start) for p in plan.create] == [("3g.40gb", 0)]


def test_demand_keeps_unrequested_idle_instances_when_there_is_room():
    current = [Instance("2g.20gb", 0, 2, key="idle-2g")]
    plan = plan_demand(H100, current, {"3g.40gb": 1})
    assert [i.key for i in plan.keep] == ["idle-2g"]
    assert [(p.profile, p.start) for p in plan.create] == [("3g.40gb", 4)]


def test_demand_destroys_idle_unrequested_instances_to_make_room():
    current = [Instance("2g.20gb", 0, 2, key="idle-2g")]
    plan = plan_demand(H100, current, {"7g.80gb": 1})
    assert [i.key for i in plan.destroy] == ["idle-2g"]
    assert [(p.profile, p.start) for p in plan.create] == [("7g.80gb", 0)]


def test_demand_leaves_out_what_cannot_fit():
    plan = plan_demand(H100, [Instance("4g.40gb", 0, 4, busy=True)], {"4g.40gb": 1, "3g.40gb": 2})
    assert [(p.profile, p.start) for p in plan.create] == [("3g.40gb", 4)]


def valid_placement_sets(model: GpuModel) -> set[tuple[tuple[str, int], ...]]:
    """Every realisable set of (profile, start) placements."""
    placements = [(p, s) for p in model.profiles for s in p.starts]
    found: set[tuple[tuple[str, int], ...]] = set()

    def walk(i: int, mask: int, chosen: list[tuple[str, int]], compute: int) -> None:
        found.add(tuple(sorted(chosen)))
        for j in range(i, len(placements)):
            profile, start = placements[j]
            bits = ((1 << profile.memory_slices) - 1) << start
            if mask & bits or sum(1 for n, _ in chosen if n == profile.name) >= profile.max_count:
                continue
            if compute + profile.compute_slices <= model.compute_slices:
                walk(j + 1, mask | bits, [*chosen, (profile.name, start)], compute + profile.compute_slices)

    walk(0, 0, [], 0)
    return found


@pytest.mark.parametrize("model", CATALOG.models, ids=lambda m: m.key)
def test_every_pinned_placement_set_is_planned_exactly(model):
    sets = valid_placement_sets(model)
    assert len(sets) > len(valid_layouts(model))
    for placements in sets:
        plan = plan_layout(model, [], [TargetEntry(p, s) for p, s in placements])
        assert sorted((p.profile, p.start) for p in plan.final) == list(placements)
