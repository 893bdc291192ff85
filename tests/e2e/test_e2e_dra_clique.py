"""A DRA claim that needs one NVLink clique, allocated by the real kube-scheduler (DynamicResources).

Two DRA nodes publish the agent's own pool for a GB200 compute tray, each from another clique of
one degraded NVL72 rack (``gb200-nvl72-degraded``: cliques 1 and 2). A claim asks for four GPUs
whose ``gpuweave.io/clique`` attribute is clique 2's, all four matching (``matchAttribute``): the
allocator gives it the four GPUs of the clique-2 tray, never the other node's. A claim whose
selector names a clique no node has stays unallocated and its pod unscheduled.

The IMEX channel: a claim from ``manifests/dra/example-claims-imex.yaml`` (four GPUs and the channel,
all matching on ``gpuweave.io/clique``) gets a tray's four GPUs and its ``imex-channel-0``; a second
claim for that tray's channel waits (one claim holds a node's channel), and so does a claim for the
channel on a third node, a DGX H100 with no clique, which publishes none.

The nodes are API objects only (no kubelet): the test ends at the binding and the allocation.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from hardware.profiles import load_profile, load_rack
from tests.e2e.cluster import (
    REPO,
    ControlPlane,
    render_scheduler_config,
    start_extender,
    start_scheduler,
    stopping,
    wait_for,
)
from tests.e2e.dra_nodes import DraCleanup, claim_pod, create_dra_node

pytestmark = pytest.mark.e2e

NAMESPACE = "e2e-dra-clique"
SCHEDULER = "e2e-dra-clique-scheduler"
NODE_LABEL = "e2e.gpuweave.io/dra-clique"
TAINT = {"key": "e2e.gpuweave.io/dra-clique", "value": "only", "effect": "NoSchedule"}
NODES = {"e2e-clique-one": 0, "e2e-clique-two": 9}  # node -> its tray in the degraded rack
# A node without a clique, under another label: a pod that may go anywhere in NODE_LABEL never
# evaluates its clique selector against this node's GPUs, which have no clique attribute.
NO_CLIQUE_NODE, NO_CLIQUE_LABEL = "e2e-clique-none", "e2e.gpuweave.io/no-clique"
NO_CLIQUE_PROFILE = "dgx-h100"


def _cliques() -> dict[str, str]:
    """Node -> the clique its tray's GPUs report (``<cluster UUID>.<clique ID>``)."""
    rack, tray = load_rack("gb200-nvl72-degraded")
    trays = rack.nodes(tray)
    return {node: trays[slot].to_inventory().nvswitch.clique or "" for node, slot in NODES.items()}  # type: ignore[union-attr]


def _claim(name: str, clique: str) -> dict[str, Any]:
    selector = {"cel": {"expression": f'device.attributes["gpuweave.io"].clique == "{clique}"'}}
    request = {
        "name": "gpus",
        "exactly": {"deviceClassName": "gpu.gpuweave.io", "count": 4, "selectors": [selector]},
    }
    constraint = {"requests": ["gpus"], "matchAttribute": "gpuweave.io/clique"}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"devices": {"requests": [request], "constraints": [constraint]}},
    }


def _imex_claim(name: str) -> dict[str, Any]:
    """A ResourceClaim with the spec of the documented template (four GPUs and the IMEX channel)."""
    template = yaml.safe_load((REPO / "manifests" / "dra" / "example-claims-imex.yaml").read_text())
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": template["spec"]["spec"],
    }


def _channel_claim(name: str) -> dict[str, Any]:
    request = {"name": "imex", "exactly": {"deviceClassName": "imex-channel.gpuweave.io"}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"devices": {"requests": [request]}},
    }


def _pod(name: str, claim: str, *, node: str | None = None) -> dict[str, Any]:
    selector = {"kubernetes.io/hostname": node} if node else {NODE_LABEL: "true"}
    pod: dict[str, Any] = claim_pod(name, claim, scheduler=SCHEDULER, selector=selector, taint=TAINT)
    return pod


@pytest.fixture(scope="module")
def clique_cluster(plane: ControlPlane, scheduler_kubeconfig: Path) -> Iterator[ControlPlane]:
    plane.apply(plane.kustomize(REPO / "manifests" / "dra"))
    plane.ensure_namespace(NAMESPACE)
    cleanup = DraCleanup(plane, NAMESPACE, [*NODES, NO_CLIQUE_NODE])
    try:
        rack, tray = load_rack("gb200-nvl72-degraded")
        trays = rack.nodes(tray)
        for node, slot in NODES.items():
            create_dra_node(plane, node, trays[slot], label=NODE_LABEL, taint=TAINT)
        profile = load_profile(NO_CLIQUE_PROFILE)
        create_dra_node(plane, NO_CLIQUE_NODE, profile, label=NO_CLIQUE_LABEL, taint=TAINT)
    except BaseException:
        cleanup.stop()
        raise
    extender, url = start_extender(plane, kubeconfig=scheduler_kubeconfig, name="dra-clique-extender")
    config = render_scheduler_config(
        plane, extender_url=url, kubeconfig=scheduler_kubeconfig, scheduler_name=SCHEDULER, claims=True
    )
    scheduler = start_scheduler(plane, config_path=config, name="dra-clique-kube-scheduler")
    with stopping(cleanup, extender, scheduler):
        yield plane


def test_a_claim_for_one_clique_gets_four_gpus_of_that_cliques_tray(clique_cluster: ControlPlane) -> None:
    plane = clique_cluster
    cliques = _cliques()
    assert len(set(cliques.values())) == 2 and all(cliques.values())
    resource = client.ResourceV1Api(plane.api)
    resource.create_namespaced_resource_claim(NAMESPACE, _claim("clique-two", cliques["e2e-clique-two"]))
    plane.core.create_namespaced_pod(NAMESPACE, _pod("needs-clique-two", "clique-two"))

    def bound() -> str | None:
        return plane.core.read_namespaced_pod("needs-clique-two", NAMESPACE).spec.node_name or None

    assert wait_for("the clique pod bound", bound, timeout=60) == "e2e-clique-two"
    claim = resource.read_namespaced_resource_claim("clique-two", NAMESPACE)
    results = claim.status.allocation.devices.results
    assert {r.pool for r in results} == {"e2e-clique-two"}
    assert sorted(r.device for r in results) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]


def test_a_claim_for_a_clique_no_node_has_stays_pending(clique_cluster: ControlPlane) -> None:
    plane = clique_cluster
    resource = client.ResourceV1Api(plane.api)
    elsewhere = "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9.1"
    resource.create_namespaced_resource_claim(NAMESPACE, _claim("clique-nowhere", elsewhere))
    plane.core.create_namespaced_pod(NAMESPACE, _pod("needs-clique-nowhere", "clique-nowhere"))

    def unschedulable() -> bool:
        pod = plane.core.read_namespaced_pod("needs-clique-nowhere", NAMESPACE)
        conditions = pod.status.conditions or []
        return any(c.type == "PodScheduled" and c.reason == "Unschedulable" for c in conditions)

    wait_for("the scheduler to mark the pod unschedulable", unschedulable, timeout=60)
    assert not plane.core.read_namespaced_pod("needs-clique-nowhere", NAMESPACE).spec.node_name
    assert resource.read_namespaced_resource_claim("clique-nowhere", NAMESPACE).status.allocation is None


def _unschedulable(plane: ControlPlane, pod: str) -> str | None:
    """The PodScheduled=False message once the scheduler gave up on the pod."""
    conditions = plane.core.read_namespaced_pod(pod, NAMESPACE).status.conditions or []
    return next(
        (c.message or "?" for c in conditions if c.type == "PodScheduled" and c.reason == "Unschedulable"),
        None,
    )


def test_the_imex_channel_goes_to_one_claim_on_a_tray_and_never_to_a_node_without_a_clique(
    clique_cluster: ControlPlane,
) -> None:
    plane = clique_cluster
    resource = client.ResourceV1Api(plane.api)
    resource.create_namespaced_resource_claim(NAMESPACE, _imex_claim("imex-job"))
    plane.core.create_namespaced_pod(NAMESPACE, _pod("imex-job", "imex-job", node="e2e-clique-one"))

    def bound() -> str | None:
        return plane.core.read_namespaced_pod("imex-job", NAMESPACE).spec.node_name or None

    assert wait_for("the IMEX pod bound", bound, timeout=60) == "e2e-clique-one"
    results = resource.read_namespaced_resource_claim("imex-job", NAMESPACE).status.allocation.devices.results
    assert {r.pool for r in results} == {"e2e-clique-one"}
    assert sorted((r.request, r.device) for r in results) == [
        *(("gpus", f"gpu-{i}") for i in range(4)),
        ("imex", "imex-channel-0"),
    ]

    # the tray's channel is held: a second claim for it waits; the DGX H100 publishes no channel
    for pod, node in (("imex-second", "e2e-clique-one"), ("imex-no-clique", NO_CLIQUE_NODE)):
        resource.create_namespaced_resource_claim(NAMESPACE, _channel_claim(pod))
        plane.core.create_namespaced_pod(NAMESPACE, _pod(pod, pod, node=node))
    for pod in ("imex-second", "imex-no-clique"):
        message = wait_for(f"{pod} unschedulable", lambda p=pod: _unschedulable(plane, p), timeout=60)
        assert "cannot allocate all claims" in message, message
        assert not plane.core.read_namespaced_pod(pod, NAMESPACE).spec.node_name
        assert resource.read_namespaced_resource_claim(pod, NAMESPACE).status.allocation is None
