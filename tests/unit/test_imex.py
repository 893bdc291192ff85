"""IMEX domains: the extender records a job's nodes at bind; the node agent decides which domain
its daemon serves, from pods the kubelet admitted, and with peers of its own clique only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from devicemodel.assignment import ImexDomain, PodAssignment, imex_domain_name
from devicemodel.contracts import (
    ANNOTATION_ASSIGNMENT,
    RESOURCE_GPU,
    RESOURCE_IMEX_CHANNEL,
    requests_resource,
)
from devicemodel.errors import InvalidInputError
from devicemodel.gangs import ANNOTATION_GANG, ANNOTATION_GANG_SIZE, ANNOTATION_GANG_TIER
from deviceplugin.handoff import PendingPod, PodView
from deviceplugin.imex_pods import wanted_domain
from gpuweave.node.imex import DOMAIN_FILE, NODES_CONFIG, ImexConfigWriter, ImexReconciler
from gpuweave.simulate.cluster_objects import (
    cluster_list,
    inventory_object,
    node_object,
    pod_object,
    profile_inventory,
)
from nodeagent.imex import imex_config
from scheduler_ext.app import Extender, build_snapshot_extender
from scheduler_ext.gangs.service import GangSettings
from scheduler_ext.serving.wire import ExtenderArgs, ExtenderBindingArgs, parse
from topology.network import LABEL_AWS_LAYER_3, LABEL_GPU_CLIQUE

CLIQUE = "6a2b1c3d-0000-4000-8000-00000000aaaa.1"
OTHER = "6a2b1c3d-0000-4000-8000-00000000aaaa.2"
NODES = {"a0": CLIQUE, "a1": CLIQUE, "a2": CLIQUE, "b0": OTHER}


# ---- the extender records the domain --------------------------------------------------------
def _extender(tmp_path: Path) -> Extender:
    items: list[dict[str, Any]] = []
    for name, clique in NODES.items():
        labels = {LABEL_GPU_CLIQUE: clique, LABEL_AWS_LAYER_3: "block-1"}
        items += [
            node_object(name, gpus=4, labels=labels),
            inventory_object(profile_inventory("gb200-compute-tray", name)),
        ]
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(cluster_list(items)))
    return build_snapshot_extender(path, gangs=GangSettings(ttl_s=60.0))


def _bind(extender: Extender, pod: dict[str, Any]) -> PodAssignment:
    names = list(NODES)
    result = extender.service.filter(parse(ExtenderArgs, {"Pod": pod, "NodeNames": names}), pod)
    assert result.NodeNames, result.FailedAndUnresolvableNodes
    meta = pod["metadata"]
    args = ExtenderBindingArgs(
        PodName=meta["name"], PodNamespace=meta["namespace"], PodUID=meta["uid"], Node=result.NodeNames[0]
    )
    assert extender.service.bind(args) == ""
    bound = extender.cache.pod_object(uid=meta["uid"])
    assert bound is not None
    return PodAssignment.from_annotation(bound["metadata"]["annotations"][ANNOTATION_ASSIGNMENT])


def _member(index: int, *, imex: bool = True) -> dict[str, Any]:
    limits: dict[str, int] = {RESOURCE_GPU: 4}
    if imex:
        limits[RESOURCE_IMEX_CHANNEL] = 1
    annotations = {
        ANNOTATION_GANG: "train",
        ANNOTATION_GANG_SIZE: "3",
        ANNOTATION_GANG_TIER: LABEL_GPU_CLIQUE,
    }
    return pod_object(f"train-{index}", namespace="ml", limits=limits, annotations=annotations)


def test_every_member_of_a_gang_gets_the_same_domain_listing_the_gangs_nodes(tmp_path: Path) -> None:
    extender = _extender(tmp_path)
    members = [_member(i) for i in range(3)]
    for member in members:  # the watch delivers every member, pending, before the first filter
        extender.cache.upsert_pod(member)
    assignments = [_bind(extender, member) for member in members]
    domains = {a.imex for a in assignments}
    assert len(domains) == 1
    (domain,) = domains
    assert domain is not None and domain.nodes == ("a0", "a1", "a2")  # the clique that holds the gang
    assert sorted(a.node for a in assignments) == ["a0", "a1", "a2"]
    assert domain.name == imex_domain_name("ml/gang:train")


def test_a_lone_pod_gets_its_own_node_and_pods_without_the_channel_get_no_domain(tmp_path: Path) -> None:
    extender = _extender(tmp_path)
    lone = _bind(extender, pod_object("solo", limits={RESOURCE_GPU: 1, RESOURCE_IMEX_CHANNEL: 1}))
    assert lone.imex == ImexDomain(name=imex_domain_name("default/solo"), nodes=(lone.node,))
    plain = _bind(extender, pod_object("plain", limits={RESOURCE_GPU: 1}))
    assert plain.imex is None and "imex" not in plain.to_annotation()  # old agents read it unchanged


def test_domain_names_are_dns_safe_and_distinct() -> None:
    first, second = imex_domain_name("ml/gang:Train_Job"), imex_domain_name("ml/gang:train-job")
    assert first != second
    for name in (first, second, imex_domain_name("x" * 400), imex_domain_name("///")):
        ImexDomain(name=name, nodes=("n",))  # validates as the annotation will
        assert len(name) <= 253


def test_a_bad_domain_in_an_annotation_is_a_clear_error() -> None:
    bad = '{"node":"n","containers":{},"imex":{"name":"x","nodes":[]}}'
    with pytest.raises(InvalidInputError, match=r"imex\.nodes"):
        PodAssignment.from_annotation(bad)


def test_requests_resource_reads_limits_requests_and_init_containers() -> None:
    assert requests_resource(pod_object("p", limits={RESOURCE_IMEX_CHANNEL: 1}), RESOURCE_IMEX_CHANNEL)
    assert requests_resource(pod_object("p", init_limits={RESOURCE_IMEX_CHANNEL: "1"}), RESOURCE_IMEX_CHANNEL)
    assert not requests_resource(pod_object("p", limits={RESOURCE_IMEX_CHANNEL: 0}), RESOURCE_IMEX_CHANNEL)
    assert not requests_resource({"spec": {"containers": "nonsense"}}, RESOURCE_IMEX_CHANNEL)


# ---- the node decides -----------------------------------------------------------------------
def _pod(
    name: str, *, node: str = "a0", nodes: tuple[str, ...] = ("a0", "a1"), imex: bool = True
) -> PendingPod:
    assignment = PodAssignment(node=node, containers={}, imex=ImexDomain(name=f"d-{name}", nodes=nodes))
    return PendingPod(f"uid-{name}", "ml", name, assignment, requests_imex=imex)


def test_the_domain_comes_from_the_one_pod_that_asks_for_the_channel() -> None:
    decision = wanted_domain([_pod("holder"), _pod("forger", imex=False)], node="a0")
    assert (
        decision.domain is not None and decision.domain.name == "d-holder" and decision.holder == "ml/holder"
    )
    assert wanted_domain([_pod("forger", imex=False)], node="a0").domain is None  # annotation alone: nothing
    two = wanted_domain([_pod("one"), _pod("two")], node="a0")
    assert two.domain is None and "all ask for the node's one IMEX channel" in two.problem
    elsewhere = wanted_domain([_pod("holder", nodes=("a1", "a2"))], node="a0")
    assert elsewhere.domain is None and "does not list node a0" in elsewhere.problem


def test_peers_outside_the_clique_are_left_out() -> None:
    domain = ImexDomain(name="d", nodes=("a0", "a1", "b0", "ghost"))
    peers = {"a0": "10.0.0.1", "a1": "10.0.0.2", "a2": "10.0.0.3"}  # the nodes labelled with a0's clique
    plan = imex_config(domain, node="a0", clique=CLIQUE, peers=peers)
    config, problem = plan.config, plan.problem
    assert (
        config is not None
        and config.nodes == ("a0", "a1")
        and config.nodes_config() == "10.0.0.1\n10.0.0.2\n"
    )
    assert "left out b0, ghost" in problem
    assert imex_config(domain, node="a0", clique=None, peers=peers).config is None
    assert imex_config(domain, node="a0", clique=CLIQUE, peers={"a1": "10.0.0.2"}).config is None


def test_the_reconciler_writes_the_domain_and_tears_it_down_with_the_job(tmp_path: Path) -> None:
    view = PodView()
    writer = ImexConfigWriter(tmp_path / "imex", simulated=True)
    lookups: list[str] = []

    def peers(clique: str) -> dict[str, str]:
        lookups.append(clique)
        return {"a0": "10.0.0.1", "a1": "10.0.0.2"}

    reconciler = ImexReconciler(view, node="a0", clique=lambda: CLIQUE, peers=peers, writer=writer)
    holder = _pod("holder")
    view.upsert(
        uid=holder.uid,
        namespace="ml",
        name="holder",
        phase="Running",
        annotation=holder.assignment.to_annotation(),
        requests_imex=True,
    )
    config = reconciler.reconcile()
    assert config is not None and lookups == [CLIQUE]
    assert (tmp_path / "imex" / NODES_CONFIG).read_text() == "10.0.0.1\n10.0.0.2\n"
    record = writer.current()
    assert record is not None and record["domain"] == "d-holder" and record["holder"] == "ml/holder"
    view.upsert(uid=holder.uid, namespace="ml", name="holder", phase="Succeeded", annotation=None)
    assert reconciler.reconcile() is None
    assert not (tmp_path / "imex" / NODES_CONFIG).exists() and not (tmp_path / "imex" / DOMAIN_FILE).exists()
