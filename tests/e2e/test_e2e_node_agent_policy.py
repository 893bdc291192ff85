"""Each node agent held to its own node by the real kube-apiserver: the ValidatingAdmissionPolicies
of manifests/admission-node-agent.yaml (in the kustomize base the e2e control plane was
given), with a token bound to an agent pod on node A, as the kubelet projects one into the
DaemonSet's pod. RBAC lets that identity write every Node, every GpuNodeInventory and evict any
pod; the policies refuse what touches node B, and the agent's own code (health.kube.KubeCluster,
deviceplugin.kube.Publisher) still writes what it writes on node A."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from devicemodel.contracts import CONDITION_NODE_SERVICEABLE, LABEL_PREFLIGHT, VERDICT_REPLACE
from devicemodel.sharing import SharingPlan
from deviceplugin.kube import Publisher
from gpuweave.simulate.cluster_objects import profile_inventory
from health.kube import EVICTION_LABEL, KubeCluster
from health.remediation import EvictionOutcome, PodRef
from health.scope import TAINT_HEALTH_PENDING, TAINT_NODE_FAULT, NodeCondition
from tests.e2e.cluster import NAMESPACE, ControlPlane
from tests.support.api_outcome import outcome
from tests.support.control_plane import create_gpu_node
from tests.support.pods import pod_body
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e

NODE_A, NODE_B = "e2e-np-a", "e2e-np-b"
WORK = "e2e-np-work"
CLIQUE = "nvidia.com/gpu.clique"
INVENTORY = ("gpuweave.io", "v1alpha1", "gpunodeinventories")
NOT_ITS_NODE = "may update only its own Node"
FOREIGN_TAINT = {"key": "example.com/maintenance", "value": "soon", "effect": "NoSchedule"}


def _pod(name: str, node: str, *, labels: dict[str, str] | None = None, **annotations: str) -> dict[str, Any]:
    return pod_body(name, node=node, labels=labels, annotations=annotations)


def _eviction(pod: Any, *, labelled: bool = True, uid: str | None = None) -> dict[str, Any]:
    meta = {"name": pod.metadata.name, "namespace": pod.metadata.namespace}
    if labelled:
        meta["labels"] = {EVICTION_LABEL: "true"}
    options = {"preconditions": {"uid": pod.metadata.uid if uid is None else uid}} if uid != "" else {}
    return {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": meta, "deleteOptions": options}


@pytest.fixture(scope="module")
def agent(plane: ControlPlane) -> Iterator[client.ApiClient]:
    """Nodes A and B with their inventories, as agents published them, and node A's agent's client."""
    for name, address in ((NODE_A, "10.0.0.1"), (NODE_B, "10.0.0.2")):
        create_gpu_node(plane.api, name, "dgx-h100")
        plane.core.patch_node(
            name, {"metadata": {"labels": {CLIQUE: "c1"}}, "spec": {"taints": [FOREIGN_TAINT]}}
        )
        status = {"addresses": [{"type": "InternalIP", "address": address}]}
        status["conditions"] = [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": ""}]
        plane.core.patch_node_status(name, {"status": status})
    plane.ensure_namespace(WORK)
    api = config.new_client_from_config(config_file=str(plane.node_agent_kubeconfig(NODE_A)))
    relabel = partial(client.CoreV1Api(api).patch_node, NODE_B, {"metadata": {"labels": {CLIQUE: "c2"}}})
    try:
        wait_until(  # the API server loads new policies through an informer, a moment after they exist
            "the node agent policies in force", lambda: NOT_ITS_NODE in outcome(relabel)
        )
        yield api
    finally:
        api.close()
        for name in (NODE_A, NODE_B):
            plane.forget_node(name)
        with contextlib.suppress(ApiException):
            plane.core.delete_namespaced_pod(
                f"gpuweave-node-agent-{NODE_A}", NAMESPACE, grace_period_seconds=0
            )


def _refused(call: Callable[[], Any], message: str) -> None:
    answer = outcome(call)
    assert message in answer, answer


def test_an_agent_cannot_relabel_or_readdress_another_node(
    plane: ControlPlane, agent: client.ApiClient
) -> None:
    core = client.CoreV1Api(agent)
    _refused(lambda: core.patch_node(NODE_B, {"metadata": {"labels": {CLIQUE: "c2"}}}), NOT_ITS_NODE)
    forged = {"status": {"addresses": [{"type": "InternalIP", "address": "10.9.9.9"}]}}
    _refused(lambda: core.patch_node_status(NODE_B, forged), NOT_ITS_NODE)
    condition = {"type": "GpuweaveGpuHealthy", "status": "False", "reason": "GpuFailed", "message": "forged"}
    _refused(lambda: core.patch_node_status(NODE_B, {"status": {"conditions": [condition]}}), NOT_ITS_NODE)
    cordon = {"spec": {"unschedulable": True}}
    _refused(lambda: core.patch_node(NODE_B, cordon), NOT_ITS_NODE)
    node_b = plane.core.read_node(NODE_B)
    assert node_b.metadata.labels[CLIQUE] == "c1" and not node_b.spec.unschedulable
    assert [a.address for a in node_b.status.addresses] == ["10.0.0.2"]
    assert [c.type for c in node_b.status.conditions] == ["Ready"]


def test_on_its_own_node_an_agent_changes_only_what_it_publishes(
    plane: ControlPlane, agent: client.ApiClient
) -> None:
    core = client.CoreV1Api(agent)
    forged = {"status": {"addresses": [{"type": "InternalIP", "address": "10.9.9.9"}]}}
    _refused(lambda: core.patch_node_status(NODE_A, forged), "not the addresses")
    ready = {"type": "Ready", "status": "False", "reason": "Forged", "message": ""}
    _refused(
        lambda: core.patch_node_status(NODE_A, {"status": {"conditions": [ready]}}), "only its conditions"
    )
    labels = {"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}}
    _refused(lambda: core.patch_node(NODE_A, labels), "only the GPU labels")
    layout = {"metadata": {"annotations": {"gpuweave.io/mig-layout": "all-1g.10gb"}}}
    _refused(lambda: core.patch_node(NODE_A, layout), "only the annotation gpuweave.io/cordoned-by-health")
    _refused(lambda: core.patch_node(NODE_A, {"spec": {"taints": []}}), "only its health taints")
    no_execute = {"spec": {"taints": [FOREIGN_TAINT, {"key": TAINT_NODE_FAULT, "effect": "NoExecute"}]}}
    _refused(lambda: core.patch_node(NODE_A, no_execute), "only its health taints")
    node_a = plane.core.read_node(NODE_A)
    assert [a.address for a in node_a.status.addresses] == ["10.0.0.1"]
    assert [t.key for t in node_a.spec.taints] == [FOREIGN_TAINT["key"]]


def test_the_agents_own_writes_to_its_node_pass(plane: ControlPlane, agent: client.ApiClient) -> None:
    """The code the agent runs: GPU labels and inventory, conditions, health taints and cordon."""
    inventory = profile_inventory("dgx-h100", NODE_A)
    publisher = Publisher(agent, snapshot=lambda: (inventory, {}, {}), sharing=SharingPlan())
    publisher.publish_once()
    health = KubeCluster(agent, node_name=NODE_A)
    health.set_conditions(
        (
            NodeCondition("GpuweaveGpuHealthy", "False", "GpuFailed", "GPU-5: Xid 79"),
            NodeCondition(CONDITION_NODE_SERVICEABLE, "False", VERDICT_REPLACE, "GPU-5: retired"),
        )
    )
    client.CoreV1Api(agent).patch_node(NODE_A, {"metadata": {"labels": {LABEL_PREFLIGHT: "agent"}}})
    health.set_taint(TAINT_HEALTH_PENDING, present=True)
    health.set_taint(TAINT_NODE_FAULT, present=True, value="efa-missing")
    health.set_cordon(True)
    health.set_taint(TAINT_HEALTH_PENDING, present=False)
    node_a = plane.core.read_node(NODE_A)
    assert node_a.metadata.labels["nvidia.com/gpu.count"] == "8" and node_a.spec.unschedulable
    assert node_a.metadata.labels["nvidia.com/cuda.driver-version.major"] == "550"
    assert [t.key for t in node_a.spec.taints] == [FOREIGN_TAINT["key"], TAINT_NODE_FAULT]
    conditions = {c.type: c.status for c in node_a.status.conditions}
    assert conditions == {"Ready": "True", "GpuweaveGpuHealthy": "False", CONDITION_NODE_SERVICEABLE: "False"}
    assert node_a.metadata.labels[LABEL_PREFLIGHT] == "agent"  # it answers gang preflights
    health.set_cordon(False)
    health.set_taint(TAINT_NODE_FAULT, present=False)
    assert not plane.core.read_node(NODE_A).spec.unschedulable


def _inventory(plane: ControlPlane, name: str) -> dict[str, Any]:
    found: dict[str, Any] = client.CustomObjectsApi(plane.api).get_cluster_custom_object(*INVENTORY, name)
    return found


def test_an_agent_writes_only_its_own_inventory(plane: ControlPlane, agent: client.ApiClient) -> None:
    custom = client.CustomObjectsApi(agent)
    message = f"the node agent of node {NODE_A} may write only its own GpuNodeInventory"
    before = _inventory(plane, NODE_B)
    unhealthy = {"status": {"unhealthyDevices": [gpu["uuid"] for gpu in before["spec"]["gpus"]]}}
    _refused(partial(custom.patch_cluster_custom_object_status, *INVENTORY, NODE_B, unhealthy), message)
    _refused(
        partial(custom.patch_cluster_custom_object, *INVENTORY, NODE_B, {"spec": {"numaNodes": 1}}), message
    )
    other = {"apiVersion": before["apiVersion"], "kind": before["kind"], "metadata": {"name": "e2e-np-c"}}
    other["spec"] = before["spec"]
    _refused(partial(custom.create_cluster_custom_object, *INVENTORY, other), message)
    after = _inventory(plane, NODE_B)
    assert (after["spec"], after["status"]) == (before["spec"], before["status"])
    mine = {"status": {"unhealthyDevices": [_inventory(plane, NODE_A)["spec"]["gpus"][0]["uuid"]]}}
    assert outcome(partial(custom.patch_cluster_custom_object_status, *INVENTORY, NODE_A, mine)) == "ok"


@pytest.fixture(scope="module")
def victims(plane: ControlPlane, agent: client.ApiClient) -> Iterator[dict[str, Any]]:
    """Pods on both nodes, once the API server's pod informer (the eviction policy's parameters)
    holds the last created (and so every one before it): a pod it has not seen yet is not checked."""
    gang = {"gpuweave.io/gang": "train", "gpuweave.io/gang-size": "2"}
    specs = {
        "gang-on-b": _pod("gang-on-b", NODE_B, **gang),
        "pod-by-pod-on-b": _pod("pod-by-pod-on-b", NODE_B, **gang, **{"gpuweave.io/gang-eviction": "pod"}),
        "opted-out-on-a": _pod("opted-out-on-a", NODE_A, labels={"gpuweave.io/no-health-eviction": "true"}),
        "on-a": _pod("on-a", NODE_A),
        "unlabelled-on-a": _pod("unlabelled-on-a", NODE_A),
        "on-b": _pod("on-b", NODE_B),
    }
    pods = {name: plane.core.create_namespaced_pod(WORK, spec) for name, spec in specs.items()}
    core = client.CoreV1Api(agent)
    last = partial(core.create_namespaced_pod_eviction, "on-b", WORK, _eviction(pods["on-b"]), dry_run="All")
    wait_until("the pods in the policy's parameters", lambda: "may evict only pods" in outcome(last))
    yield pods
    plane.core.delete_collection_namespaced_pod(WORK, grace_period_seconds=0)


def _evicting(plane: ControlPlane, name: str) -> bool:
    return plane.core.read_namespaced_pod(name, WORK).metadata.deletion_timestamp is not None


def test_an_agent_cannot_evict_a_pod_on_another_node(
    plane: ControlPlane, agent: client.ApiClient, victims: dict[str, Any]
) -> None:
    core = client.CoreV1Api(agent)
    for name in ("on-b", "pod-by-pod-on-b", "opted-out-on-a"):
        evict = partial(core.create_namespaced_pod_eviction, name, WORK, _eviction(victims[name]))
        _refused(evict, "may evict only pods")
        assert not _evicting(plane, name)
    health = KubeCluster(agent, node_name=NODE_A)  # the agent's own eviction path, same answer
    victim = victims["on-b"].metadata
    assert (
        health.evict(PodRef(WORK, "on-b", frozenset(), uid=victim.uid), grace_s=5) == EvictionOutcome.FAILED
    )
    assert not _evicting(plane, "on-b")


def test_an_agents_eviction_names_the_pod_and_carries_its_label(
    plane: ControlPlane, agent: client.ApiClient, victims: dict[str, Any]
) -> None:
    core = client.CoreV1Api(agent)
    pod = victims["unlabelled-on-a"]
    name = pod.metadata.name
    unlabelled, without_uid = _eviction(pod, labelled=False), _eviction(pod, uid="")
    _refused(partial(core.create_namespaced_pod_eviction, name, WORK, unlabelled), "must label")
    _refused(partial(core.create_namespaced_pod_eviction, name, WORK, without_uid), "UID")
    wrong = _eviction(pod, uid="0b2d8c2e-0000-4000-8000-000000000000")
    _refused(partial(core.create_namespaced_pod_eviction, name, WORK, wrong), "must name the UID")
    assert not _evicting(plane, pod.metadata.name)


def test_an_agent_evicts_pods_on_its_node_and_members_of_a_gang_that_goes_together(
    plane: ControlPlane, agent: client.ApiClient, victims: dict[str, Any]
) -> None:
    health = KubeCluster(agent, node_name=NODE_A)
    for name in ("on-a", "gang-on-b"):
        ref = PodRef(WORK, name, frozenset(), uid=victims[name].metadata.uid)
        assert health.evict(ref, grace_s=5) == EvictionOutcome.EVICTED
        assert _evicting(plane, name)


def test_a_token_that_names_no_node_is_not_held_by_these_policies(plane: ControlPlane) -> None:
    """The documented choice (docs/deploy.md): RBAC alone applies to such a token."""
    create_gpu_node(plane.api, "e2e-np-unbound", "dgx-h100")
    try:
        unbound = config.new_client_from_config(
            config_file=str(plane.service_account_kubeconfig("gpuweave-node-agent"))
        )
        with contextlib.closing(unbound):
            patch = {"metadata": {"labels": {CLIQUE: "c9"}}}
            assert outcome(lambda: client.CoreV1Api(unbound).patch_node("e2e-np-unbound", patch)) == "ok"
    finally:
        plane.forget_node("e2e-np-unbound")
