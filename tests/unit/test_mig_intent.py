"""Declared layouts from the node annotation and demand-driven plans from pending pods."""

from __future__ import annotations

import pytest

from devicemodel.errors import InvalidInputError
from hardware.mig_catalog import default_catalog
from mig.intent import (
    GpuMigState,
    derive_demand_plans,
    mig_requests,
    parse_layout_annotation,
    parse_profile_list,
)
from mig.planner import Instance, TargetEntry

H100 = default_catalog().model("H100-80GB")
A30 = default_catalog().model("A30-24GB")


def test_annotation_with_profiles_pins_empty_and_whole():
    layout = parse_layout_annotation(
        '{"gpus": {"3": ["3g.40gb", "3g.40gb"], "4": ["1g.10gb@6"], "5": [], "6": null}}'
    )
    assert layout == {
        3: (TargetEntry("3g.40gb"), TargetEntry("3g.40gb")),
        4: (TargetEntry("1g.10gb", 6),),
        5: (),
        6: None,
    }


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("not json", "bad gpuweave.io/mig-layout annotation"),
        ('{"gpus": {"x": []}}', "is not a GPU UUID"),
        ('{"gpus": {"1": "3g.40gb"}}', "at gpus.1"),
        ('{"gpu": {}}', "bad gpuweave.io/mig-layout annotation"),
        ('{"gpus": {"1": ["3g.40gb@x"]}}', "PROFILE@START"),
    ],
)
def test_bad_annotation_is_a_clear_error(value, reason):
    with pytest.raises(InvalidInputError, match=reason):
        parse_layout_annotation(value)


def test_cli_profile_list():
    assert parse_profile_list("3g.40gb, 1g.10gb@6") == (TargetEntry("3g.40gb"), TargetEntry("1g.10gb", 6))
    assert parse_profile_list("") == ()


def test_mig_requests_keeps_only_mig_resources():
    assert mig_requests({"nvidia.com/mig-1g.10gb": 2, "nvidia.com/gpu": 1, "cpu": 3}) == {"1g.10gb": 2}


def test_demand_fills_gpus_in_order_and_respects_busy_instances():
    gpus = [
        GpuMigState(0, H100, (Instance("7g.80gb", 0, 8, busy=True),)),
        GpuMigState(1, H100, (Instance("3g.40gb", 0, 4, busy=True),)),
        GpuMigState(2, H100, ()),
    ]
    plans = derive_demand_plans([{"1g.10gb": 2}, {"1g.10gb": 2}], gpus)
    assert set(plans) == {1, 2}
    assert [p.start for p in plans[1].create] == [4, 5, 6]
    assert [p.start for p in plans[2].create] == [6]


def test_idle_instances_serve_demand_before_new_ones_are_made():
    gpus = [GpuMigState(0, H100, (Instance("1g.10gb", 6, 1),)), GpuMigState(1, H100, ())]
    assert derive_demand_plans([{"1g.10gb": 1}], gpus) == {}
    plans = derive_demand_plans([{"1g.10gb": 2}], gpus)
    assert list(plans) == [0] and len(plans[0].create) == 1 and not plans[0].destroy


def test_profiles_a_model_lacks_are_skipped():
    gpus = [GpuMigState(0, A30, ()), GpuMigState(1, H100, ())]
    plans = derive_demand_plans([{"3g.40gb": 1}], gpus)
    assert list(plans) == [1]


def test_demand_prefers_free_room_over_destroying_idle_instances():
    gpus = [
        GpuMigState(0, H100, (Instance("3g.40gb", 0, 4), Instance("3g.40gb", 4, 4))),
        GpuMigState(1, H100, (Instance("1g.10gb", 0, 1),)),
    ]
    plans = derive_demand_plans([{"1g.10gb": 3}], gpus)
    assert list(plans) == [1] and not plans[1].destroy and len(plans[1].create) == 2
    plans = derive_demand_plans([{"7g.80gb": 1}], gpus[:1])
    assert [i.start for i in plans[0].destroy] == [0, 4]
