"""The extender's claim scores against the real kube-scheduler 1.37 (DynamicResources on) and
kube-apiserver: the shipped scheduler configuration with the claims entry appended
(manifests/scheduler/claims-extender.yaml), the extender process with the gpuweave-scheduler
identity (its RBAC reads ResourceClaims and ResourceSlices).

Two DRA nodes publish the agent's own pool for a100-pcie-nvbridge-4 (two NVLink pairs, gpu-0/1 in
nvl0 and gpu-2/3 in nvl1). A claim allocated by hand holds gpu-2 on one node and gpu-0 + gpu-2 on
the other, so both can still give a claim two GPUs, but only the first from one NVLink pair. The
allocator alone would accept either node; the pod lands on the first, and its claim is allocated
two GPUs of one domain.

The nodes are API objects only (no kubelet): the test ends at the binding and the allocation.
"""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from hardware.profiles import load_profile
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

NAMESPACE = "e2e-dra-scoring"
SCHEDULER = "e2e-dra-scoring-scheduler"
NODE_LABEL = "e2e.gpuweave.io/dra-scoring"
TAINT = {"key": "e2e.gpuweave.io/dra-scoring", "value": "only", "effect": "NoSchedule"}
PAIR_FREE, PAIRS_SPLIT = "e2e-dra-pair-free", "e2e-dra-pairs-split"
HELD = {PAIR_FREE: ["gpu-2"], PAIRS_SPLIT: ["gpu-0", "gpu-2"]}
DOMAIN = {"gpu-0": "nvl0", "gpu-1": "nvl0", "gpu-2": "nvl1", "gpu-3": "nvl1"}


def _two_gpus(name: str) -> dict[str, Any]:
    request = {"name": "gpus", "exactly": {"deviceClassName": "gpu.gpuweave.io", "count": 2}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"devices": {"requests": [request]}},
    }


def _hold(plane: ControlPlane, node: str, devices: list[str]) -> None:
    """A claim allocated by hand on ``node`` (as a running pod's would be): the allocator and the
    extender both count its devices as taken."""
    resource = client.ResourceV1Api(plane.api)
    name = f"held-{node}"
    claim = _two_gpus(name)
    claim["spec"]["devices"]["requests"][0]["exactly"]["count"] = len(devices)
    resource.create_namespaced_resource_claim(NAMESPACE, claim)
    results = [{"request": "gpus", "driver": "gpuweave.io", "pool": node, "device": d} for d in devices]
    selector = {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]
    }
    status = {"allocation": {"devices": {"results": results}, "nodeSelector": selector}}
    resource.patch_namespaced_resource_claim_status(name, NAMESPACE, {"status": status})


@pytest.fixture(scope="module")
def scoring_cluster(plane: ControlPlane, scheduler_kubeconfig: Path) -> Iterator[tuple[ControlPlane, str]]:
    """The DeviceClasses, two DRA nodes with their pools and held claims and the claim the test's
    pod uses, then the extender (its first lists see them all, so no watch race) and a
    kube-scheduler with the shipped two-entry configuration."""
    plane.apply(plane.kustomize(REPO / "manifests" / "dra"))
    plane.ensure_namespace(NAMESPACE)
    cleanup = DraCleanup(plane, NAMESPACE, HELD)
    try:
        for node, devices in HELD.items():
            create_dra_node(plane, node, load_profile("a100-pcie-nvbridge-4"), label=NODE_LABEL, taint=TAINT)
            _hold(plane, node, devices)
        client.ResourceV1Api(plane.api).create_namespaced_resource_claim(NAMESPACE, _two_gpus("pair"))
    except BaseException:
        cleanup.stop()
        raise
    extender, url = start_extender(plane, kubeconfig=scheduler_kubeconfig, name="dra-scoring-extender")
    config = render_scheduler_config(
        plane, extender_url=url, kubeconfig=scheduler_kubeconfig, scheduler_name=SCHEDULER, claims=True
    )
    scheduler = start_scheduler(plane, config_path=config, name="dra-scoring-kube-scheduler")
    with stopping(cleanup, extender, scheduler):
        yield plane, url


def _pod(name: str, claim: str) -> dict[str, Any]:
    pod: dict[str, Any] = claim_pod(
        name, claim, scheduler=SCHEDULER, selector={NODE_LABEL: "true"}, taint=TAINT
    )
    # the in-tree plugins prefer the other node (NodeAffinity, weight 2: 200 points), so only the
    # extender's claim score (10 vs 2, x weight 12 x 10: 960 points) sends the pod to the node
    # where its GPUs form an NVLink pair; without it the pod would go there
    prefer = {
        "matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [PAIRS_SPLIT]}]
    }
    pod["spec"]["affinity"] = {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "preference": prefer}]
        }
    }
    return pod


def _claim_scores_answered(url: str) -> float:
    """How many prioritize-claims calls the extender answered (its latency histogram's count)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
        text = response.read().decode()
    pattern = r'^gpuweave_extender_request_seconds_count\{verb="prioritize-claims"\} ([0-9.e+]+)$'
    found = re.search(pattern, text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def test_claim_pod_lands_where_its_gpus_come_from_one_nvlink_pair(
    scoring_cluster: tuple[ControlPlane, str],
) -> None:
    plane, url = scoring_cluster
    resource = client.ResourceV1Api(plane.api)
    plane.core.create_namespaced_pod(NAMESPACE, _pod("dra-pair", "pair"))

    def bound() -> str | None:
        pod = plane.core.read_namespaced_pod("dra-pair", NAMESPACE)
        return pod.spec.node_name or None

    node = wait_for("the claim pod bound", bound, timeout=60)
    assert node == PAIR_FREE
    claim = resource.read_namespaced_resource_claim("pair", NAMESPACE)
    devices = [r.device for r in claim.status.allocation.devices.results]
    assert {r.pool for r in claim.status.allocation.devices.results} == {PAIR_FREE}
    assert len(devices) == 2 and len({DOMAIN[d] for d in devices}) == 1, devices
    # kube-scheduler reached the extender through the second entry (the pod requests no managed
    # resource, so the first entry is never called for it): the choice was the extender's
    assert _claim_scores_answered(url) >= 1


def test_the_topology_example_claim_is_accepted_as_written(scoring_cluster: tuple[ControlPlane, str]) -> None:
    """manifests/dra/example-claims-topology.yaml is valid resource.k8s.io/v1 and keeps its three
    constraints (read back: a dropped field would not fail the write)."""
    plane, _ = scoring_cluster
    doc = yaml.safe_load((REPO / "manifests" / "dra" / "example-claims-topology.yaml").read_text())
    doc["metadata"]["namespace"] = NAMESPACE
    resource = client.ResourceV1Api(plane.api)
    resource.create_namespaced_resource_claim_template(NAMESPACE, doc)
    stored = resource.read_namespaced_resource_claim_template(doc["metadata"]["name"], NAMESPACE)
    constraints = stored.spec.spec.devices.constraints
    assert [c.match_attribute for c in constraints] == [
        c["matchAttribute"] for c in doc["spec"]["spec"]["devices"]["constraints"]
    ]
