"""The MIG service: control-route validation, declared layouts followed from the node annotation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from devicemodel.errors import InvalidInputError
from hardware.simulated.lib import SimulatedNvmlLib
from mig.service import LayoutFollower, MigService
from tests.support.sim_mig import sim_mig_service


def service(tmp_path: Path) -> tuple[MigService, SimulatedNvmlLib]:
    return sim_mig_service(tmp_path)


@pytest.mark.parametrize(
    ("params", "reason"),
    [
        ({"gpu": 1}, "give either"),
        ({"gpu": 1, "profiles": ["1g.10gb"], "whole": True}, "give either"),
        ({"gpu": -1, "profiles": []}, "at gpu"),
        ({"gpu": 1, "profiles": "1g.10gb"}, "at profiles"),
        ({"gpu": 1, "profiles": [], "extra": 1}, "at extra"),
    ],
)
def test_bad_apply_params_are_invalid_input(tmp_path, params, reason):
    mig, _ = service(tmp_path)
    with pytest.raises(InvalidInputError, match=reason):
        mig.route_apply(params)


def test_plan_route_changes_nothing(tmp_path):
    mig, lib = service(tmp_path)
    plan = mig.route_plan({"gpu": 2, "profiles": ["3g.40gb", "1g.10gb@6"]})
    assert plan["create"] == [
        {"profile": "3g.40gb", "start": 0, "size": 4},
        {"profile": "1g.10gb", "start": 6, "size": 1},
    ]
    assert lib.mig_node is not None and not lib.mig_node.gpus[2].mig_enabled


def test_follower_applies_changes_and_retries_until_the_blocker_drains(tmp_path):
    mig, lib = service(tmp_path)
    box: dict[str, str | None] = {"value": None}
    follower = LayoutFollower(lambda: box["value"], mig)
    assert follower.poll_once() == []
    box["value"] = json.dumps({"gpus": {"2": ["7g.80gb"]}})
    first = follower.poll_once()
    assert [r.gpu_index for r in first] == [2]
    assert follower.poll_once() == []  # unchanged value: nothing to do
    assert lib.mig_node is not None
    lib.mig_node.gpus[2].set_busy(first[0].created[0].mig_uuid)
    box["value"] = json.dumps({"gpus": {"2": ["3g.40gb", "3g.40gb"]}})
    assert follower.poll_once() == []  # blocked by the busy 7g; logged, retried next poll
    lib.mig_node.gpus[2].set_busy(first[0].created[0].mig_uuid, busy=False)
    again = follower.poll_once()
    assert [[c.profile for c in r.created] for r in again] == [["3g.40gb", "3g.40gb"]]
