"""The IMEX domain of a DRA claim end to end: `gpuweave node-agent --dra` on a simulated GB200 tray
(its own service account and manifests/dra's RBAC), the kubelet's DRA manager (`harness node`) and
the real kube-apiserver with the GpuImexDomain CRD.

The job's GpuImexDomain (manifests/dra/example-imex-domain.yaml) already lists two other nodes, as
their agents wrote them: a tray of the same clique and one of another clique (both Nodes with their
InternalIP and clique label). A pod's claim, made from manifests/dra/example-claims-imex.yaml (four
GPUs and the channel; its config names the domain), is allocated on the tray by hand and the pod
bound there: the kubelet prepares it through the agent, which adds the tray's entry to the domain's
status and writes the IMEX daemon's node list from the status (the tray and its clique peer, not the
other clique's node). Deleting the pod unprepares the claim: the entry and the node list are gone.
A claim whose config is not an ImexChannelConfig is not prepared, with the reason in the kubelet's
log, and joins nothing. The node agent's identity, with a token bound to a pod on a node, may write
that node's entry and no other (manifests/dra/admission-imex-domains.yaml), and may not create or
change the objects themselves (RBAC).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from hardware.profiles import load_profile
from hardware.simulated.backend import SimulatedBackend
from tests.e2e.cluster import REPO, ControlPlane, SimNode, stopping, wait_for
from tests.e2e.conftest import add_taint
from tests.support.api_outcome import outcome as _outcome
from topology.network import LABEL_GPU_CLIQUE

pytestmark = pytest.mark.e2e

TRAY = "e2e-imex-t0"
PEER, ELSEWHERE = "e2e-imex-t1", "e2e-imex-x1"
NAMESPACE = "e2e-imex"
NAMESPACE_AGENT = "gpuweave-system"
TAINT = {"key": "e2e.gpuweave.io/imex-domain", "value": "only", "effect": "NoSchedule"}
GROUP, VERSION, PLURAL = "gpuweave.io", "v1alpha1", "gpuimexdomains"
MERGE_PATCH = "application/merge-patch+json"
DOMAIN = "train"


def _tray_clique() -> str:
    backend = SimulatedBackend(load_profile("gb200-compute-tray"), node_name=TRAY)
    try:
        fabric = backend.discover().nvswitch
    finally:
        backend.close()
    assert fabric is not None and fabric.clique
    return fabric.clique


CLIQUE = _tray_clique()
OTHER = CLIQUE.rsplit(".", 1)[0] + ".7"


def _create_peer(plane: ControlPlane, name: str, clique: str, address: str) -> None:
    """A Node no kubelet runs (cordoned, tainted) with a clique label and an InternalIP."""
    metadata = {"name": name, "labels": {LABEL_GPU_CLIQUE: clique}}
    plane.core.create_node({"metadata": metadata, "spec": {"unschedulable": True, "taints": [TAINT]}})
    plane.core.patch_node_status(
        name, {"status": {"addresses": [{"type": "InternalIP", "address": address}]}}
    )


class _Forget:
    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane

    def stop(self) -> None:
        with contextlib.suppress(ApiException):
            self.plane.core.delete_collection_namespaced_pod(NAMESPACE, grace_period_seconds=0)
        with contextlib.suppress(ApiException):
            client.ResourceV1Api(self.plane.api).delete_collection_namespaced_resource_claim(NAMESPACE)
        with contextlib.suppress(ApiException):
            self._custom().delete_collection_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL)
        for name in (PEER, ELSEWHERE):
            with contextlib.suppress(ApiException):
                self.plane.core.delete_node(name)
        self.plane.forget_node(TRAY)

    def _custom(self) -> Any:
        return client.CustomObjectsApi(self.plane.api)


def _pool(plane: ControlPlane) -> set[str]:
    found = client.ResourceV1Api(plane.api).list_resource_slice(field_selector=f"spec.nodeName={TRAY}")
    return {d.name for s in found.items for d in s.spec.devices or []}


@pytest.fixture(scope="module")
def tray(plane: ControlPlane, agent_kubeconfig: Path) -> Iterator[SimNode]:
    plane.apply(plane.kustomize(REPO / "manifests" / "dra"))
    plane.ensure_namespace(NAMESPACE)
    forget = _Forget(plane)
    try:
        _create_peer(plane, PEER, CLIQUE, "10.0.0.11")
        _create_peer(plane, ELSEWHERE, OTHER, "10.0.1.10")
        node = SimNode(
            plane,
            name=TRAY,
            profile="gb200-compute-tray",
            agent_kubeconfig=agent_kubeconfig,
            agent_args=("--dra",),
        )
    except BaseException:
        forget.stop()
        raise
    with stopping(forget, node):
        wait_for(
            "the tray's IMEX channel published",
            lambda: node.agent.alive_and(lambda: "imex-channel-0" in _pool(plane)),
            timeout=90,
        )
        add_taint(plane, TRAY, TAINT)
        wait_for(
            "the tray's clique label",
            lambda: (node.node().metadata.labels or {}).get(LABEL_GPU_CLIQUE) == CLIQUE,
            timeout=60,
        )
        yield node


def _domain(plane: ControlPlane) -> dict[str, Any]:
    found: dict[str, Any] = client.CustomObjectsApi(plane.api).get_namespaced_custom_object(
        GROUP, VERSION, NAMESPACE, PLURAL, DOMAIN
    )
    return found


def _status_nodes(plane: ControlPlane) -> list[dict[str, str]]:
    return list((_domain(plane).get("status") or {}).get("nodes") or [])


def _create_domain_with_other_nodes(plane: ControlPlane) -> None:
    """The documented GpuImexDomain (3 nodes here), and the entries the two other nodes' agents wrote."""
    body = yaml.safe_load((REPO / "manifests" / "dra" / "example-imex-domain.yaml").read_text())
    body["spec"]["numNodes"] = 3
    custom = client.CustomObjectsApi(plane.api)
    custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, body)
    nodes = [
        {"name": PEER, "address": "10.0.0.11", "clique": CLIQUE},
        {"name": ELSEWHERE, "address": "10.0.1.10", "clique": OTHER},
    ]
    custom.patch_namespaced_custom_object_status(
        GROUP,
        VERSION,
        NAMESPACE,
        PLURAL,
        DOMAIN,
        {"status": {"nodes": nodes}},
        _content_type=MERGE_PATCH,
    )


def _claim_spec(parameters: Any | None = None) -> dict[str, Any]:
    template = yaml.safe_load((REPO / "manifests" / "dra" / "example-claims-imex.yaml").read_text())
    spec: dict[str, Any] = template["spec"]["spec"]
    if parameters is not None:
        spec["devices"]["config"][0]["opaque"]["parameters"] = parameters
    return spec


def _run_on_the_tray(plane: ControlPlane, name: str, spec: dict[str, Any]) -> None:
    """The claim allocated on the tray (four GPUs and the channel, its config copied, reserved for the
    pod) as kube-scheduler would, and the pod bound there."""
    resource = client.ResourceV1Api(plane.api)
    resource.create_namespaced_resource_claim(NAMESPACE, {"metadata": {"name": name}, "spec": spec})
    pod = plane.core.create_namespaced_pod(
        NAMESPACE,
        {
            "metadata": {"name": name},
            "spec": {
                "schedulerName": "e2e-nobody",  # bound below, by hand
                "terminationGracePeriodSeconds": 1,
                "tolerations": [{**TAINT, "operator": "Equal"}],
                "resourceClaims": [{"name": "devices", "resourceClaimName": name}],
                "containers": [
                    {"name": "main", "image": "e2e/none", "resources": {"claims": [{"name": "devices"}]}}
                ],
            },
        },
    )
    results = [
        {"request": request, "driver": "gpuweave.io", "pool": TRAY, "device": device}
        for request, device in [*(("gpus", f"gpu-{i}") for i in range(4)), ("imex", "imex-channel-0")]
    ]
    config = [{"source": "FromClaim", **entry} for entry in spec["devices"]["config"]]
    status = {
        "allocation": {"devices": {"results": results, "config": config}},
        "reservedFor": [{"resource": "pods", "name": name, "uid": pod.metadata.uid}],
    }
    resource.patch_namespaced_resource_claim_status(name, NAMESPACE, {"status": status})
    binding = {"metadata": {"name": name}, "target": {"apiVersion": "v1", "kind": "Node", "name": TRAY}}
    plane.core.create_namespaced_pod_binding(name, NAMESPACE, binding, _preload_content=False)


def _delete(plane: ControlPlane, name: str) -> None:
    plane.core.delete_namespaced_pod(name, NAMESPACE)

    def gone() -> bool:
        try:
            plane.core.read_namespaced_pod(name, NAMESPACE)
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_for(f"pod {name} gone", gone, timeout=60)
    client.ResourceV1Api(plane.api).delete_namespaced_resource_claim(name, NAMESPACE)


@pytest.fixture(scope="module")
def domain(tray: SimNode) -> str:
    _create_domain_with_other_nodes(tray.plane)
    return DOMAIN


def test_a_claim_with_bad_imex_config_is_not_prepared_and_joins_nothing(tray: SimNode, domain: str) -> None:
    plane = tray.plane
    _run_on_the_tray(
        plane, "bad-config", _claim_spec({"apiVersion": "gpuweave.io/v1alpha1", "kind": "Wrong"})
    )
    try:
        wanted = "opaque parameters of driver gpuweave.io are not an ImexChannelConfig"
        wait_for(
            "the prepare error in the kubelet's log",
            lambda: wanted in tray.kubelet.log_path.read_text(),
            timeout=60,
        )
        assert plane.core.read_namespaced_pod("bad-config", NAMESPACE).status.phase == "Pending"
        assert [n["name"] for n in _status_nodes(plane)] == [PEER, ELSEWHERE]
    finally:
        _delete(plane, "bad-config")


def test_the_tray_joins_the_domain_at_prepare_and_leaves_it_at_unprepare(tray: SimNode, domain: str) -> None:
    plane = tray.plane
    nodes_config = tray.state_dir / "imex" / "nodes_config.cfg"
    _run_on_the_tray(plane, "train-0", _claim_spec())
    try:
        wait_for("pod train-0 admitted", lambda: plane.allocation_of(NAMESPACE, "train-0"), timeout=60)
        entries = wait_for(
            "the tray's entry", lambda: len(_status_nodes(plane)) == 3 and _status_nodes(plane)
        )
        assert entries[0] == {
            "name": TRAY,
            "address": "127.0.0.1",
            "clique": CLIQUE,
        }  # harness node's InternalIP
        assert [n["name"] for n in entries] == [TRAY, PEER, ELSEWHERE]
        wait_for("the IMEX node list", nodes_config.exists, timeout=30)
        assert nodes_config.read_text() == "127.0.0.1\n10.0.0.11\n"  # ELSEWHERE is in another clique
    finally:
        _delete(plane, "train-0")
    wait_for(
        "the tray's entry removed",
        lambda: [n["name"] for n in _status_nodes(plane)] == [PEER, ELSEWHERE],
        timeout=30,
    )
    wait_for("the IMEX node list removed", lambda: not nodes_config.exists(), timeout=30)


def test_an_agent_identity_writes_only_the_entry_of_its_own_node(tray: SimNode, domain: str) -> None:
    plane = tray.plane
    host = {
        "metadata": {"name": "gpuweave-node-agent-imex"},
        "spec": {"serviceAccountName": "gpuweave-node-agent", "nodeName": "e2e-imex-y0",
                 "containers": [{"name": "c", "image": "e2e/none"}]},
    }  # fmt: skip
    agent_pod = plane.core.create_namespaced_pod(NAMESPACE_AGENT, host)
    kubeconfig = plane.service_account_kubeconfig("gpuweave-node-agent", bound_pod=agent_pod)
    api = config.new_client_from_config(config_file=str(kubeconfig))
    try:
        custom = client.CustomObjectsApi(api)
        own = {"name": "e2e-imex-y0", "address": "10.0.2.10", "clique": OTHER}
        peer = {"name": PEER, "address": "10.9.9.9", "clique": CLIQUE}

        def write(nodes: list[dict[str, str]], **dry_run: str) -> str:
            version = _domain(plane)["metadata"]["resourceVersion"]
            body = {"metadata": {"resourceVersion": version}, "status": {"nodes": nodes}}
            patch = partial(
                custom.patch_namespaced_custom_object_status, _content_type=MERGE_PATCH, **dry_run
            )
            return _outcome(partial(patch, GROUP, VERSION, NAMESPACE, PLURAL, DOMAIN, body))

        current = _status_nodes(plane)
        assert [n["name"] for n in current] == [PEER, ELSEWHERE]
        changed = [peer if n["name"] == PEER else n for n in current]
        refusal = "may write only its own entry of a GpuImexDomain's status.nodes"
        probe = partial(write, changed, dry_run="All")  # stores nothing while the policy is not loaded yet
        wait_for("the admission policy in force", lambda: refusal in probe(), timeout=30)
        assert refusal in write(changed)
        assert write([*current, own]) == "ok"
        assert [n["name"] for n in _status_nodes(plane)] == [PEER, ELSEWHERE, "e2e-imex-y0"]
        assert refusal in write([own])  # removing the others' entries too
        assert write(current) == "ok"  # its own entry removed
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "GpuImexDomain", "metadata": {"name": "forged"},
                "spec": {"numNodes": 1}}  # fmt: skip
        create = partial(custom.create_namespaced_custom_object, GROUP, VERSION, NAMESPACE, PLURAL, body)
        assert _outcome(create).startswith("403 ")
        grow = partial(
            custom.patch_namespaced_custom_object,
            GROUP,
            VERSION,
            NAMESPACE,
            PLURAL,
            DOMAIN,
            {"spec": {"numNodes": 9}},
        )
        assert _outcome(grow).startswith("403 ")
    finally:
        api.close()
        plane.core.delete_namespaced_pod("gpuweave-node-agent-imex", NAMESPACE_AGENT, grace_period_seconds=0)
