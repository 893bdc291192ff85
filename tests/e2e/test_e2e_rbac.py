"""Least privilege, enforced by the real kube-apiserver's RBAC for our service accounts."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from kubeio.lease import LeaseElector
from tests.e2e.cluster import NAMESPACE, ControlPlane
from tests.support.pods import pod_body
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e

INVENTORY = ("gpuweave.io", "v1alpha1", "gpunodeinventories")


@pytest.fixture(scope="module")
def rbac_node(plane: ControlPlane) -> Iterator[str]:
    """A Node object (created by the admin) for the service accounts to try their hands on, deleted
    at the end: the agent DaemonSet selects it, and the uninstall test waits for every node it selects."""
    name = "e2e-rbac-node"
    plane.core.create_node({"metadata": {"name": name, "labels": {"gpuweave.io/gpu-node": "true"}}})
    yield name
    plane.forget_node(name)


def _client(kubeconfig: Path) -> Iterator[client.ApiClient]:
    api = config.new_client_from_config(config_file=str(kubeconfig))
    try:
        yield api
    finally:
        api.close()


@pytest.fixture(scope="module")
def agent_api(agent_kubeconfig: Path) -> Iterator[client.ApiClient]:
    yield from _client(agent_kubeconfig)


@pytest.fixture(scope="module")
def scheduler_api(scheduler_kubeconfig: Path) -> Iterator[client.ApiClient]:
    yield from _client(scheduler_kubeconfig)


def _status_of(call: Callable[[], Any]) -> int:
    try:
        call()
    except ApiException as exc:
        return int(exc.status)
    return 200


def test_node_agent_may_do_its_job(agent_api: client.ApiClient, rbac_node: str) -> None:
    core = client.CoreV1Api(agent_api)
    custom = client.CustomObjectsApi(agent_api)
    core.patch_node(rbac_node, {"metadata": {"labels": {"nvidia.com/gpu.count": "8"}}})
    body = {"apiVersion": "gpuweave.io/v1alpha1", "kind": "GpuNodeInventory", "metadata": {"name": rbac_node}}
    assert _status_of(lambda: custom.create_cluster_custom_object(*INVENTORY, body)) in (200, 422)
    core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={rbac_node}")


@pytest.mark.parametrize(
    "action",
    ["delete pod", "create pod", "bind pod", "read secrets", "delete node", "write pod annotation"],
)
def test_node_agent_is_refused(
    action: str, agent_api: client.ApiClient, plane: ControlPlane, workload_namespace: str, rbac_node: str
) -> None:
    core = client.CoreV1Api(agent_api)
    name = f"victim-{action.replace(' ', '-')}"
    plane.core.create_namespaced_pod(workload_namespace, pod_body(name))
    binding = {"metadata": {"name": name}, "target": {"kind": "Node", "name": rbac_node}}
    calls: dict[str, Callable[[], Any]] = {
        "delete pod": lambda: core.delete_namespaced_pod(name, workload_namespace),
        "create pod": lambda: core.create_namespaced_pod(workload_namespace, pod_body(name + "-new")),
        "bind pod": lambda: core.create_namespaced_binding(workload_namespace, binding),
        "read secrets": lambda: core.list_namespaced_secret(NAMESPACE),
        "delete node": lambda: core.delete_node(rbac_node),
        "write pod annotation": lambda: core.patch_namespaced_pod(
            name, workload_namespace, {"metadata": {"annotations": {"gpuweave.io/assignment": "{}"}}}
        ),
    }
    assert _status_of(calls[action]) == 403
    assert plane.core.read_namespaced_pod(name, workload_namespace).metadata.deletion_timestamp is None


KUEUE_WORKLOADS = ("kueue.x-k8s.io", "v1beta2")


@pytest.mark.parametrize(
    "action",
    [
        "write inventory",
        "label node",
        "evict pod",
        "read secrets",
        "create bad-hardware",
        "write pod annotation",
        "deactivate a kueue workload",
        "delete a kueue workload",
    ],
)
def test_scheduler_identity_is_refused(
    action: str, scheduler_api: client.ApiClient, plane: ControlPlane, workload_namespace: str, rbac_node: str
) -> None:
    core = client.CoreV1Api(scheduler_api)
    custom = client.CustomObjectsApi(scheduler_api)
    name = f"sched-victim-{action.replace(' ', '-')}"
    plane.core.create_namespaced_pod(workload_namespace, pod_body(name))
    inventory = {
        "apiVersion": "gpuweave.io/v1alpha1",
        "kind": "GpuNodeInventory",
        "metadata": {"name": "forged"},
    }
    bad = {"apiVersion": "gpuweave.io/v1alpha1", "kind": "GpuBadHardware", "metadata": {"name": "forged"}}
    eviction = {"metadata": {"name": name, "namespace": workload_namespace}}
    calls: dict[str, Callable[[], Any]] = {
        "write inventory": lambda: custom.create_cluster_custom_object(*INVENTORY, inventory),
        "label node": lambda: core.patch_node(rbac_node, {"metadata": {"labels": {"forged": "true"}}}),
        "evict pod": lambda: core.create_namespaced_pod_eviction(name, workload_namespace, eviction),
        "read secrets": lambda: core.list_namespaced_secret(NAMESPACE),
        "create bad-hardware": lambda: custom.create_cluster_custom_object(
            "gpuweave.io", "v1alpha1", "gpubadhardwares", bad
        ),
        "write pod annotation": lambda: core.patch_namespaced_pod(
            name, workload_namespace, {"metadata": {"annotations": {"gpuweave.io/assignment": "{}"}}}
        ),
        # the extender writes a Workload's status (its own check's entry), never its spec
        "deactivate a kueue workload": lambda: custom.patch_namespaced_custom_object(
            *KUEUE_WORKLOADS, workload_namespace, "workloads", "any", {"spec": {"active": False}}
        ),
        "delete a kueue workload": lambda: custom.delete_namespaced_custom_object(
            *KUEUE_WORKLOADS, workload_namespace, "workloads", "any"
        ),
    }
    assert _status_of(calls[action]) == 403


def test_scheduler_identity_may_bind_with_the_assignment(
    scheduler_api: client.ApiClient, plane: ControlPlane, workload_namespace: str, rbac_node: str
) -> None:
    """The extender's bind: one pods/binding call whose annotations kube-apiserver writes onto the pod."""
    core = client.CoreV1Api(scheduler_api)
    name = "bind-me"
    created = plane.core.create_namespaced_pod(workload_namespace, pod_body(name))
    binding = client.V1Binding(
        metadata=client.V1ObjectMeta(
            name=name, uid=created.metadata.uid, annotations={"gpuweave.io/assignment": "{}"}
        ),
        target=client.V1ObjectReference(api_version="v1", kind="Node", name=rbac_node),
    )
    core.create_namespaced_pod_binding(name, workload_namespace, binding, _preload_content=False)
    bound = plane.core.read_namespaced_pod(name, workload_namespace)
    assert bound.spec.node_name == rbac_node
    assert bound.metadata.annotations["gpuweave.io/assignment"] == "{}"


def test_assignment_correction_rbac_grants_pod_patch_only_while_applied(
    agent_api: client.ApiClient, plane: ControlPlane, workload_namespace: str
) -> None:
    """``--correct-assignments`` needs rbac-node-agent-assignments.yaml; the base role stays without it."""
    core = client.CoreV1Api(agent_api)
    name = "victim-correction"
    plane.core.create_namespaced_pod(workload_namespace, pod_body(name))
    patch = {"metadata": {"annotations": {"gpuweave.io/assignment": "{}"}}}
    optional = Path(__file__).parents[2] / "manifests" / "rbac-node-agent-assignments.yaml"
    plane.apply([doc for doc in yaml.safe_load_all(optional.read_text()) if doc])
    try:
        wait_until(
            "the agent may patch pods",
            lambda: _status_of(lambda: core.patch_namespaced_pod(name, workload_namespace, patch)) == 200,
        )
        assert _status_of(lambda: core.delete_namespaced_pod(name, workload_namespace)) == 403
    finally:
        client.RbacAuthorizationV1Api(plane.api).delete_cluster_role_binding(
            "gpuweave-node-agent-assignments"
        )
    wait_until(
        "the base role refuses pod patches again",
        lambda: _status_of(lambda: core.patch_namespaced_pod(name, workload_namespace, patch)) == 403,
    )


def test_the_extenders_lease_role_lets_it_elect_on_its_own_lease_only(plane: ControlPlane) -> None:
    """Role gpuweave-extender-leader-election alone (bound to an account of its own, as the
    scheduler's broader Role would hide a gap): the extender's elector creates and renews the Lease
    gpuweave-extender; another Lease it may create (RBAC cannot limit create by name) but neither
    read nor renew."""
    account = "e2e-extender-lease-only"
    plane.core.create_namespaced_service_account(NAMESPACE, {"metadata": {"name": account}})
    binding = {
        "metadata": {"name": account, "namespace": NAMESPACE},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": "gpuweave-extender-leader-election",
        },
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}],
    }
    client.RbacAuthorizationV1Api(plane.api).create_namespaced_role_binding(NAMESPACE, binding)
    api = config.new_client_from_config(str(plane.service_account_kubeconfig(account)))
    leases = client.CoordinationV1Api(api)
    elector = LeaseElector(leases, namespace=NAMESPACE, name="gpuweave-extender", identity="rbac-check")
    try:
        wait_until("the Role's grants to take effect", elector.try_once, timeout=30)
        assert elector.try_once()  # read and renewed: get and update on its own Lease
        assert _status_of(lambda: leases.read_namespaced_lease("gpuweave-scheduler", NAMESPACE)) == 403
        other = {"metadata": {"name": "e2e-not-the-extenders"}, "spec": {"holderIdentity": "x"}}
        leases.create_namespaced_lease(NAMESPACE, other)
        assert _status_of(lambda: leases.read_namespaced_lease("e2e-not-the-extenders", NAMESPACE)) == 403
    finally:
        elector.release()
        admin = client.CoordinationV1Api(plane.api)
        for name in ("gpuweave-extender", "e2e-not-the-extenders"):
            try:
                admin.delete_namespaced_lease(name, NAMESPACE)
            except ApiException as exc:
                if exc.status != 404:
                    raise
        client.RbacAuthorizationV1Api(plane.api).delete_namespaced_role_binding(account, NAMESPACE)
        plane.core.delete_namespaced_service_account(account, NAMESPACE)
        api.close()
