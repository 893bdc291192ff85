"""Who may write gpuweave.io/assignment, enforced by the real kube-apiserver: the
ValidatingAdmissionPolicy of manifests/admission-assignment.yaml (in the kustomize base the
session's control plane was given) refuses a plain user's writes, lets the extender's identity
bind with it, and lets the node agent's identity correct it on pods of its own node only."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config

from tests.e2e.cluster import NAMESPACE, ControlPlane
from tests.support.api_outcome import outcome as _outcome
from tests.support.pods import pod_body
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e

SPACE = "e2e-admission"
PLAIN = "e2e-plain-user"
KEY = "gpuweave.io/assignment"
REFUSED = "cannot be set or changed here"


def _refused(call: Callable[[], Any]) -> bool:
    return REFUSED in _outcome(call)


def _allowed(call: Callable[[], Any]) -> bool:
    return _outcome(call) == "ok"


@contextlib.contextmanager
def _api(path: Path) -> Iterator[client.ApiClient]:
    api = config.new_client_from_config(config_file=str(path))
    try:
        yield api
    finally:
        api.close()


@pytest.fixture(scope="module")
def plain(plane: ControlPlane) -> Iterator[client.CoreV1Api]:
    """A user who may create, patch and bind pods in one namespace, and is nobody of gpuweave's."""
    plane.ensure_namespace(SPACE)
    plane.core.create_namespaced_service_account(SPACE, {"metadata": {"name": PLAIN}})
    rbac = client.RbacAuthorizationV1Api(plane.api)
    rules = [
        {
            "apiGroups": [""],
            "resources": ["pods", "pods/binding"],
            "verbs": ["create", "get", "patch", "update"],
        }
    ]
    rbac.create_namespaced_role(SPACE, {"metadata": {"name": PLAIN}, "rules": rules})
    rbac.create_namespaced_role_binding(
        SPACE,
        {
            "metadata": {"name": PLAIN},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": PLAIN},
            "subjects": [{"kind": "ServiceAccount", "name": PLAIN, "namespace": SPACE}],
        },
    )
    with _api(plane.service_account_kubeconfig(PLAIN, namespace=SPACE)) as api:
        core = client.CoreV1Api(api)
        probe = pod_body("probe", annotations={KEY: "{}"})
        attempt = partial(core.create_namespaced_pod, SPACE, probe, dry_run="All")
        wait_until(  # the API server loads a new policy through an informer, a moment after it exists
            "the assignment admission policy in force", partial(_refused, attempt)
        )
        yield core


def test_a_plain_user_cannot_create_a_pod_with_an_assignment(plain: client.CoreV1Api) -> None:
    forged = pod_body("forged", annotations={KEY: "{}"})
    refused = _outcome(lambda: plain.create_namespaced_pod(SPACE, forged))
    assert REFUSED in refused and "gpuweave-assignment-writers" in refused
    assert _outcome(lambda: plain.create_namespaced_pod(SPACE, pod_body("honest"))) == "ok"


def test_a_plain_user_cannot_add_or_change_an_assignment(
    plane: ControlPlane, plain: client.CoreV1Api
) -> None:
    plain.create_namespaced_pod(SPACE, pod_body("patched"))
    forged = {"metadata": {"annotations": {KEY: '{"node": "n", "containers": {}}'}}}
    assert REFUSED in _outcome(lambda: plain.patch_namespaced_pod("patched", SPACE, forged))
    other = {"metadata": {"annotations": {"example.com/note": "fine"}}}
    assert _outcome(lambda: plain.patch_namespaced_pod("patched", SPACE, other)) == "ok"
    plane.core.patch_namespaced_pod("patched", SPACE, forged)  # a cluster admin (system:masters) may
    changed = {"metadata": {"annotations": {KEY: "{}"}}}
    assert REFUSED in _outcome(lambda: plain.patch_namespaced_pod("patched", SPACE, changed))
    removed = {"metadata": {"annotations": {KEY: None}}}
    assert REFUSED in _outcome(lambda: plain.patch_namespaced_pod("patched", SPACE, removed))


def _binding(name: str, uid: str, node: str, *, assignment: str | None) -> client.V1Binding:
    annotations = {KEY: assignment} if assignment is not None else None
    return client.V1Binding(
        metadata=client.V1ObjectMeta(name=name, uid=uid, annotations=annotations),
        target=client.V1ObjectReference(api_version="v1", kind="Node", name=node),
    )


def test_only_the_extenders_identity_binds_with_an_assignment(
    plane: ControlPlane, plain: client.CoreV1Api, scheduler_kubeconfig: Path
) -> None:
    for name in ("bound-by-plain", "bound-by-extender"):
        plane.core.create_namespaced_pod(SPACE, pod_body(name))
    uid = plane.core.read_namespaced_pod("bound-by-plain", SPACE).metadata.uid
    forged = _binding("bound-by-plain", uid, "node-a", assignment="{}")
    refused = _outcome(
        lambda: plain.create_namespaced_pod_binding("bound-by-plain", SPACE, forged, _preload_content=False)
    )
    assert "only the gpuweave extender" in refused
    assert plane.core.read_namespaced_pod("bound-by-plain", SPACE).spec.node_name is None
    extender = client.CoreV1Api(config.new_client_from_config(config_file=str(scheduler_kubeconfig)))
    uid = plane.core.read_namespaced_pod("bound-by-extender", SPACE).metadata.uid
    body = _binding("bound-by-extender", uid, "node-a", assignment="{}")
    extender.create_namespaced_pod_binding("bound-by-extender", SPACE, body, _preload_content=False)
    bound = plane.core.read_namespaced_pod("bound-by-extender", SPACE)
    assert bound.spec.node_name == "node-a" and bound.metadata.annotations[KEY] == "{}"


def test_the_node_agent_corrects_assignments_only_on_its_own_node(plane: ControlPlane) -> None:
    """A token bound to the agent's pod names the pod's node; the policy holds the agent to it."""
    optional = Path(__file__).parents[2] / "manifests" / "rbac-node-agent-assignments.yaml"
    plane.apply([doc for doc in yaml.safe_load_all(optional.read_text()) if doc])
    try:
        host = pod_body("gpuweave-node-agent-x", node="node-a")
        host["spec"]["serviceAccountName"] = "gpuweave-node-agent"
        agent_pod = plane.core.create_namespaced_pod(NAMESPACE, host)
        kubeconfig = plane.service_account_kubeconfig("gpuweave-node-agent", bound_pod=agent_pod)
        for name, node in (("on-node-a", "node-a"), ("on-node-b", "node-b")):
            plane.core.create_namespaced_pod(SPACE, pod_body(name, node=node))
        patch = {"metadata": {"annotations": {KEY: '{"node": "node-a", "containers": {}}'}}}
        with _api(kubeconfig) as api:
            agent = client.CoreV1Api(api)
            on_a = partial(agent.patch_namespaced_pod, "on-node-a", SPACE, patch)
            wait_until("the agent may patch pods (RBAC applied)", partial(_allowed, on_a))
            assert _refused(partial(agent.patch_namespaced_pod, "on-node-b", SPACE, patch))
    finally:
        client.RbacAuthorizationV1Api(plane.api).delete_cluster_role_binding(
            "gpuweave-node-agent-assignments"
        )
        _outcome(
            partial(
                plane.core.delete_namespaced_pod, "gpuweave-node-agent-x", NAMESPACE, grace_period_seconds=0
            )
        )
