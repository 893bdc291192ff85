"""Demand mode's pure decisions: which pods count, which node may claim, and whether plans cover."""

from __future__ import annotations

import pytest

from hardware.mig_catalog import default_catalog
from mig.demand import (
    CLAIM_ANNOTATION,
    CLAIM_TIME_ANNOTATION,
    Claim,
    ClaimAction,
    PendingPod,
    claim_action,
    claim_annotations,
    claim_of,
    could_run_here,
    demand_covered,
    format_time,
    parse_time,
    pod_requests,
    select_demand,
    wants_mig,
)
from mig.intent import GpuMigState, derive_demand_plans, node_demand
from mig.kube_demand import pending_pod_of
from mig.planner import Instance

H100 = default_catalog().model("H100-80GB")
NOW = 1_800_000_000.0
TTL = 120.0


def pod(name: str = "p", **changes: object) -> PendingPod:
    fields: dict[str, object] = {
        "namespace": "work",
        "name": name,
        "uid": f"uid-{name}",
        "resource_version": "7",
        "phase": "Pending",
        "unschedulable": True,
        "requests": {"1g.10gb": 1},
    }
    fields.update(changes)
    return PendingPod(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changes", "counts"),
    [
        ({}, True),
        ({"phase": "Running"}, False),
        ({"unschedulable": False}, False),  # not (yet) marked unschedulable by the scheduler
        ({"requests": {}}, False),
        ({"requests": {"1g.10gb": 0}}, False),
        ({"requests": {"1g.10gb+me": 2}}, True),
    ],
)
def test_which_pods_count(changes, counts):
    assert wants_mig(pod(**changes)) is counts


@pytest.mark.parametrize(
    ("changes", "labels", "here"),
    [
        ({}, {}, True),
        ({"node_name": "node-a"}, {}, True),
        ({"node_name": "node-b"}, {}, False),
        ({"node_selector": {"pool": "mig"}}, {"pool": "mig", "zone": "z1"}, True),
        ({"node_selector": {"pool": "mig"}}, {"pool": "cpu"}, False),
        ({"node_selector": {"pool": "mig"}}, {}, False),
        ({"node_selector": {"pool": "mig", "zone": "z1"}}, {"pool": "mig"}, False),
    ],
)
def test_node_name_and_selector_decide_where_a_pod_could_run(changes, labels, here):
    assert could_run_here(pod(**changes), node="node-a", labels=labels) is here


@pytest.mark.parametrize(
    ("claim", "action"),
    [
        (None, ClaimAction.CLAIM),
        (Claim("node-b", NOW - 10), ClaimAction.SKIP),  # another node's live claim
        (Claim("node-b", NOW - TTL), ClaimAction.CLAIM),  # expired: take it over
        (Claim("node-b", None), ClaimAction.CLAIM),  # unreadable time counts as expired
        (Claim("node-a", NOW - 10), ClaimAction.HELD),
        (Claim("node-a", NOW - TTL - 1), ClaimAction.SKIP),  # ours expired: others get a turn first
        (Claim("node-a", NOW - 2 * TTL), ClaimAction.CLAIM),
    ],
)
def test_which_node_may_claim(claim, action):
    assert claim_action(pod(claim=claim), node="node-a", now=NOW, ttl_s=TTL) is action


def test_select_demand_splits_held_from_claimable_in_name_order():
    pods = [
        pod("c"),
        pod("a", claim=Claim("node-a", NOW - 5)),
        pod("b", claim=Claim("node-b", NOW - 5)),
        pod("d", node_selector={"pool": "other"}),
        pod("e", unschedulable=False),
        pod("f", claim=Claim("node-b", NOW - 500)),
        pod("0", namespace="zz"),
    ]
    view = select_demand(pods, node="node-a", labels={"pool": "mig"}, now=NOW, ttl_s=TTL)
    assert [p.name for p in view.held] == ["a"]
    assert [p.key for p in view.to_claim] == ["work/c", "work/f", "zz/0"]


def test_two_nodes_see_the_same_unclaimed_pod_and_both_try_only_one_wins_at_the_api():
    # both nodes decide CLAIM; the resourceVersion precondition picks one (transport test)
    one = pod()
    assert claim_action(one, node="node-a", now=NOW) is ClaimAction.CLAIM
    assert claim_action(one, node="node-b", now=NOW) is ClaimAction.CLAIM
    won = pod(claim=claim_of(claim_annotations("node-a", NOW)))
    assert claim_action(won, node="node-b", now=NOW + 1) is ClaimAction.SKIP
    assert claim_action(won, node="node-a", now=NOW + 1) is ClaimAction.HELD


def test_claim_annotations_round_trip():
    annotations = claim_annotations("node-a", NOW)
    assert annotations[CLAIM_ANNOTATION] == "node-a"
    assert annotations[CLAIM_TIME_ANNOTATION] == format_time(NOW) == "2027-01-15T08:00:00Z"
    assert claim_of(annotations) == Claim("node-a", NOW)
    assert claim_of({CLAIM_ANNOTATION: "node-a", CLAIM_TIME_ANNOTATION: "yesterday"}) == Claim("node-a", None)
    assert claim_of({"other": "x"}) is None and claim_of(None) is None
    assert parse_time("2027-01-15T08:00:00Z") == NOW


@pytest.mark.parametrize(
    ("containers", "init", "expected"),
    [
        ([{"nvidia.com/mig-1g.10gb": 1, "cpu": 2}], [], {"1g.10gb": 1}),
        ([{"nvidia.com/mig-1g.10gb": 1}, {"nvidia.com/mig-1g.10gb": 2}], [], {"1g.10gb": 3}),
        ([{"nvidia.com/mig-1g.10gb.me": 1}], [], {"1g.10gb+me": 1}),
        ([{"nvidia.com/mig-1g.10gb": 1}], [{"nvidia.com/mig-1g.10gb": 2}], {"1g.10gb": 2}),
        ([{"nvidia.com/gpu": 1}], [{"nvidia.com/mig-3g.40gb": 1}], {"3g.40gb": 1}),
        ([{}], [], {}),
    ],
)
def test_pod_requests_sum_containers_and_take_the_largest_init_container(containers, init, expected):
    assert pod_requests(containers, init) == expected


def gpu(index: int, *instances: Instance) -> GpuMigState:
    return GpuMigState(index, H100, tuple(instances))


@pytest.mark.parametrize(
    ("pending", "gpus", "covered"),
    [
        ([{"1g.10gb": 1}], [gpu(0)], True),  # an instance is created on the empty GPU
        ([{"1g.10gb": 1}], [gpu(0, Instance("1g.10gb", 6, 1))], True),  # an idle one serves
        ([{"1g.10gb": 1}], [gpu(0, Instance("1g.10gb", 6, 1, busy=True))], True),  # room beside it
        ([{"7g.80gb": 1}], [gpu(0, Instance("1g.10gb", 6, 1, busy=True))], False),  # busy blocks
        ([{"3g.40gb": 1}, {"3g.40gb": 2}], [gpu(0), gpu(1)], True),
        ([{"3g.40gb": 3}], [gpu(0, Instance("3g.40gb", 4, 4, busy=True))], False),
        ([{"1g.10gb": 1}], [], False),  # no MIG-enabled GPU
    ],
)
def test_demand_covered_only_when_every_request_gets_an_idle_instance(pending, gpus, covered):
    plans = derive_demand_plans(pending, gpus)
    assert demand_covered(pending, gpus, plans) is covered


def test_node_agent_mig_demand_without_an_api_server_is_a_one_line_error(tmp_path, capsys):
    from gpuweave.cli import main  # noqa: PLC0415

    argv = ["node-agent", "--kubelet-dir", str(tmp_path), "--simulate", "dgx-h100", "--mig-demand"]
    assert main([*argv, "--no-kube"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gpuweave node-agent: --mig-demand watches pending pods")
    assert "give --kubeconfig too" in err


def test_node_agent_mig_mode_demand_needs_an_api_server_and_contradictions_are_refused(tmp_path, capsys):
    from gpuweave.cli import main  # noqa: PLC0415

    argv = ["node-agent", "--kubelet-dir", str(tmp_path), "--simulate", "dgx-h100", "--no-kube"]
    assert main([*argv, "--mig-mode", "demand"]) == 2
    assert capsys.readouterr().err.startswith("gpuweave node-agent: --mig-mode demand watches pending pods")
    assert main([*argv, "--mig-mode", "off", "--mig-demand"]) == 2
    assert "--mig-demand contradicts --mig-mode off" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "mode"),
    [
        ([], "declared"),
        (["--mig-mode", "off"], "off"),
        (["--mig-demand"], "demand"),
        (["--mig-mode", "demand"], "demand"),
    ],
)
def test_node_agent_mig_mode_and_its_older_form(flags, mode, tmp_path):
    from gpuweave.cli import build_parser  # noqa: PLC0415
    from gpuweave.commands.node_agent import mig_mode  # noqa: PLC0415

    args = build_parser().parse_args(
        ["node-agent", "--kubelet-dir", str(tmp_path), "--state-dir", str(tmp_path), *flags]
    )
    assert mig_mode(args) == mode


@pytest.mark.timeout(30)  # a count of 10^7 planned one instance at a time took 59 s and 761 MB
def test_a_demand_count_past_what_the_gpus_hold_is_capped_by_the_hardware():
    """Any pending pod's nvidia.com/mig-* request counts as demand: 10^7 instances of 1g.10gb are
    planned as the 7 per H100 that fit, on each GPU."""
    huge = [{"1g.10gb": 10**7, "7g.80gb": 10**7}]
    assert node_demand(huge, [gpu(0), gpu(1)]) == {"1g.10gb": 14, "7g.80gb": 2}
    assert node_demand([{"1g.10gb": 3}], [gpu(0)]) == {"1g.10gb": 3}
    assert node_demand([{"9g.999gb": 5}], [gpu(0)]) == {}  # a profile no GPU here offers
    plans = derive_demand_plans([{"1g.10gb": 10**7}], [gpu(0), gpu(1)])
    assert sorted(len(plan.create) for plan in plans.values()) == [7, 7]
    assert not demand_covered([{"1g.10gb": 10**7}], [gpu(0), gpu(1)], plans)


@pytest.mark.parametrize("value", ["1.5", "-3", "500m", "1e30", str(10**7), "2Gi"])
def test_a_mig_request_that_is_no_sane_count_is_left_out_with_a_log_naming_the_pod(value, caplog):
    resources = {"requests": {"nvidia.com/mig-1g.10gb": value, "nvidia.com/mig-2g.20gb": "2", "cpu": "500m"}}
    pod = {
        "metadata": {"namespace": "ns", "name": "greedy"},
        "spec": {"containers": [{"resources": resources}]},
    }
    with caplog.at_level("WARNING", logger="mig.kube_demand"):
        assert pending_pod_of(pod).requests == {"2g.20gb": 2}
    assert any(
        "ns/greedy" in r.getMessage() and "nvidia.com/mig-1g.10gb" in r.getMessage() for r in caplog.records
    )
