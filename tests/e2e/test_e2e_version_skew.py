"""gpuweave on the oldest supported Kubernetes minor, 1.34: one cluster whose every component is
the harness built at k8s.io/kubernetes v1.34 (bin/harness-k134: kube-apiserver, kube-scheduler,
the kubelet's device and DRA managers), with the four DRA feature gates that 1.37 turns on left
off, as 1.34 ships them. Smoke tests of each path: a GPU pod placed through the extender gets its
GPUs from the node agent's Allocate, a gang's two members are bound together, a ResourceClaim for
a GPU is allocated and prepared by the DRA driver, and the driver, finding that the API server
dropped its shared counters, publishes a pool that needs none (whole GPUs, no MIG placements)
instead of rewriting the pool on every health round.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from devicemodel.gangs import ANNOTATION_GANG, ANNOTATION_GANG_SIZE
from gpuweave.simulate.cluster_objects import profile_inventory
from tests.e2e.cluster import (
    REPO,
    ControlPlane,
    Process,
    SimNode,
    harness_k134_binary,
    render_scheduler_config,
    start_extender,
    start_scheduler,
    stopping,
    wait_for,
)
from tests.e2e.conftest import add_taint, own_plane_fixtures
from tests.e2e.gpu_nodes import create_gpu_node, held_devices
from tests.e2e.pods import GPU, SCHEDULER_NAME, allocated_gpus, assigned_devices, wait_admitted
from tests.support.pods import pod_body

pytestmark = pytest.mark.e2e

plane, scheduler_kubeconfig = own_plane_fixtures("e2e-k134", harness=harness_k134_binary)

NAMESPACE = "e2e-k134"
PLUGIN_NODE, DRA_NODE = "k134-l40s", "k134-dra-h100"
GANG_NODES = ("k134-gang-0", "k134-gang-1")
TAINT = {"key": "e2e.gpuweave.io/k134-only", "value": "only", "effect": "NoSchedule"}
DRA_TAINT = {"key": "e2e.gpuweave.io/k134-dra", "value": "only", "effect": "NoSchedule"}


class K134Cluster:
    """The module's processes: a device-plugin node, a DRA node, the extender and kube-scheduler."""

    def __init__(self, plane: ControlPlane, *, plugin_node: SimNode, dra_node: SimNode, extender: Process):
        self.plane = plane
        self.plugin_node = plugin_node
        self.dra_node = dra_node
        self.extender = extender


def _health(work: Path) -> Path:
    path = work / "k134-health.yaml"
    path.write_text(yaml.safe_dump({"health": {"round_interval_s": 1, "startup_rounds": 1}}))
    return path


def _pool(plane: ControlPlane) -> list[Any]:
    return (
        client.ResourceV1Api(plane.api).list_resource_slice(field_selector=f"spec.nodeName={DRA_NODE}").items
    )


@pytest.fixture(scope="module")
def k134(plane: ControlPlane, scheduler_kubeconfig: Path) -> Iterator[K134Cluster]:
    plane.apply(plane.kustomize(REPO / "manifests" / "dra"))
    plane.ensure_namespace(NAMESPACE)
    health = _health(plane.work)
    plugin_node = SimNode(
        plane,
        name=PLUGIN_NODE,
        profile="l40s-pcie-8",
        agent_kubeconfig=plane.node_agent_kubeconfig(PLUGIN_NODE),
        health_config=health,
    )
    dra_node = SimNode(
        plane,
        name=DRA_NODE,
        profile="dgx-h100",
        agent_kubeconfig=plane.service_account_kubeconfig("gpuweave-node-agent"),
        health_config=health,
        agent_args=("--dra", "--dra-mig", "dynamic"),
    )
    extender, url = start_extender(plane, kubeconfig=scheduler_kubeconfig)
    config_path = render_scheduler_config(
        plane, extender_url=url, kubeconfig=scheduler_kubeconfig, claims=True
    )
    scheduler = start_scheduler(plane, config_path=config_path)
    with stopping(plugin_node, dra_node, extender, scheduler):
        plugin_node.wait_resource(GPU, allocatable=8, timeout=90)
        wait_for(f"{DRA_NODE}'s ResourceSlices", lambda: dra_node.agent.alive_and(lambda: bool(_pool(plane))))
        add_taint(plane, DRA_NODE, DRA_TAINT)
        yield K134Cluster(plane, plugin_node=plugin_node, dra_node=dra_node, extender=extender)


def test_the_cluster_runs_kubernetes_1_34(k134: K134Cluster) -> None:
    info = client.VersionApi(k134.plane.api).get_code()
    assert (info.major, info.minor) == ("1", "34"), info.git_version
    assert k134.plugin_node.node().status.node_info.kubelet_version.startswith("v1.34.")


def test_a_gpu_pod_placed_through_the_extender_gets_its_gpus_from_allocate(k134: K134Cluster) -> None:
    plane = k134.plane
    body = pod_body(
        "k134-two-gpus",
        scheduler=SCHEDULER_NAME,
        grace_s=0,
        limits={GPU: 2},
        node_selector={"kubernetes.io/hostname": PLUGIN_NODE},
        container="main",
        image="e2e/none",
    )
    plane.core.create_namespaced_pod(NAMESPACE, body)
    try:
        pod, allocation = wait_admitted(plane, NAMESPACE, "k134-two-gpus")
        assert pod.spec.node_name == PLUGIN_NODE
        granted = allocated_gpus(allocation)
        assert len(granted) == 2
        assert sorted(assigned_devices(pod)[GPU]) == sorted(granted)  # Allocate followed the extender
    finally:
        plane.core.delete_namespaced_pod("k134-two-gpus", NAMESPACE, grace_period_seconds=0)


def _gang_member(name: str) -> dict[str, Any]:
    return pod_body(
        name,
        scheduler=SCHEDULER_NAME,
        grace_s=0,
        limits={GPU: 8},
        tolerations=[TAINT],
        node_selector={"e2e.gpuweave.io/k134-gang": "true"},
        annotations={ANNOTATION_GANG: "k134-train", ANNOTATION_GANG_SIZE: "2"},
        container="main",
        image="e2e/none",
    )


def _bound(plane: ControlPlane, name: str) -> str | None:
    node: str | None = plane.core.read_namespaced_pod(name, NAMESPACE).spec.node_name
    return node


def _wait_bound(plane: ControlPlane, name: str) -> str:
    return wait_for(f"{name} bound", lambda: _bound(plane, name))


def test_a_gang_of_two_is_bound_together(k134: K134Cluster) -> None:
    plane = k134.plane
    for name in GANG_NODES:
        create_gpu_node(
            plane,
            profile_inventory("dgx-h100", name),
            labels={"kubernetes.io/hostname": name, "e2e.gpuweave.io/k134-gang": "true"},
            taint=TAINT,
            resources={"cpu": "96", "memory": "1Ti", "pods": "110", GPU: "8"},
        )
    members = ("k134-train-0", "k134-train-1")
    try:
        for name in members:
            plane.core.create_namespaced_pod(NAMESPACE, _gang_member(name))
        nodes = {_wait_bound(plane, name) for name in members}
        assert nodes == set(GANG_NODES)
        held = held_devices(plane, NAMESPACE)
        assert sum(1 for pods in held.values() if pods[0].startswith("k134-train-")) == 16
    finally:
        for name in members:
            plane.core.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)
        for name in GANG_NODES:
            plane.forget_node(name)


def _claim_pod(name: str, claim: str) -> dict[str, Any]:
    return pod_body(
        name,
        scheduler=SCHEDULER_NAME,
        grace_s=0,
        claims={"gpus": claim},
        node_selector={"kubernetes.io/hostname": DRA_NODE},
        tolerations=[DRA_TAINT],
        container="main",
        image="e2e/none",
    )


def test_a_resource_claim_for_a_gpu_is_allocated_and_prepared(k134: K134Cluster) -> None:
    plane = k134.plane
    resource: Any = client.ResourceV1Api(plane.api)
    request = {"name": "gpu", "exactly": {"deviceClassName": "gpu.gpuweave.io"}}
    claim = {"metadata": {"name": "k134-one-gpu"}, "spec": {"devices": {"requests": [request]}}}
    resource.create_namespaced_resource_claim(NAMESPACE, claim)
    plane.core.create_namespaced_pod(NAMESPACE, _claim_pod("k134-claim-pod", "k134-one-gpu"))
    try:

        def prepared() -> dict[str, Any] | None:
            allocation = plane.allocation_of(NAMESPACE, "k134-claim-pod")
            return allocation["containers"]["main"] if allocation else None

        got = wait_for("the claim prepared by the DRA driver", prepared, timeout=90)
        stored = resource.read_namespaced_resource_claim("k134-one-gpu", NAMESPACE)
        (result,) = stored.status.allocation.devices.results
        assert (result.driver, result.pool) == ("gpuweave.io", DRA_NODE)
        assert result.device.startswith("gpu-") and "-mig-" not in result.device
        assert [d["device"] for d in got["claimDevices"]] == [result.device]
        uid = stored.metadata.uid
        assert got["cdiDevices"] == [f"gpuweave.io/claim={uid}-{result.device}"]
    finally:
        plane.core.delete_namespaced_pod("k134-claim-pod", NAMESPACE, grace_period_seconds=0)


def test_the_dra_pool_needs_no_field_the_api_server_drops(k134: K134Cluster) -> None:
    """The 1.34 API server dropped the shared counters of --dra-mig dynamic: the driver said so
    once and publishes whole GPUs without counters, and the pool stays at the generation it
    reached then (a driver that compared with what it sent rewrote it on every health round)."""
    slices = _pool(k134.plane)
    assert not any(s.spec.shared_counters for s in slices)
    devices = [d for s in slices for d in s.spec.devices or []]
    assert sorted(d.name for d in devices) == sorted(f"gpu-{i}" for i in range(8))
    assert not any(d.consumes_counters for d in devices)
    log = k134.dra_node.agent.log_path.read_text()
    assert log.count("feature gate DRAPartitionableDevices off") == 1, log[-2000:]
    generations = {s.spec.pool.generation for s in slices}
    assert generations == {2}, generations  # the full pool, then the one the server keeps whole
    print(json.dumps({"pool": sorted(d.name for d in devices), "generation": sorted(generations)}))
