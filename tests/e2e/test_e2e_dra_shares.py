"""Shares of fractional GPUs through DRA, end to end: `gpuweave node-agent --dra` with a sharing
configuration on a simulated L40S node (GPUs 0, 1 and 2 fractional, each with its supervised MPS
daemon), kube-scheduler's DynamicResources plugin allocating consumable capacity, the ResourceClaim
controller, and the kubelet's DRA manager (`harness node`) preparing claims through the agent.

Three claims made from capacity requests of 30, 50 and 30 compute units: the first two share one
GPU (the allocator packs the GPU's shared device while a claim fits; memory, which they do not
name, is charged at its default of 0), the third goes to the other fractional GPU. Each prepared
claim's CDI edits, resolved by the CDI library, give its container that GPU's MPS pipe directory
(the daemon the agent supervises for it, from `mps.status`), mounted, and its own limit.

Pod specs written for the device plugin run unchanged: `nvidia.com/gpu: 1` and
`gpuweave.io/gpu-compute: 30` are served through the DeviceClasses' extendedResourceName
(kube-scheduler makes the pod's claim; the kubelet's DRA manager prepares it): a whole GPU, and 30
units of one fractional GPU (the one whose units are open, with no share on it) with its MPS pipe
directory and the limit 30.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, dynamic
from kubernetes.client.exceptions import ApiException

from nodeagent.control import call_agent
from tests.e2e.cluster import (
    REPO,
    ControlPlane,
    SimNode,
    render_scheduler_config,
    start_controllers,
    start_scheduler,
    stopping,
    wait_for,
)
from tests.e2e.conftest import add_taint
from tests.e2e.test_e2e_cdi import resolve
from tests.support.agent_process import short_temp_dir
from tests.support.pods import pod_body

pytestmark = pytest.mark.e2e

NODE = "e2e-dra-shares"
SCHEDULER = "e2e-dra-shares-scheduler"
NAMESPACE = "e2e-dra-shares"
TAINT = {"key": "e2e.gpuweave.io/dra-shares", "value": "only", "effect": "NoSchedule"}
SHARING = {
    "apiVersion": "gpuweave.io/v1alpha1",
    "kind": "SharingConfig",
    "gpus": {"0": {"mode": "fractional"}, "1": {"mode": "fractional"}, "2": {"mode": "fractional"}},
}


def _pool(plane: ControlPlane) -> dict[str, Any]:
    found = client.ResourceV1Api(plane.api).list_resource_slice(field_selector=f"spec.nodeName={NODE}")
    return {d.name: d for s in found.items for d in s.spec.devices or []}


class _Forget:
    def __init__(self, plane: ControlPlane, pipes: Path) -> None:
        self.plane = plane
        self.pipes = pipes

    def stop(self) -> None:
        resource = client.ResourceV1Api(self.plane.api)
        for call in (
            lambda: self.plane.core.delete_collection_namespaced_pod(NAMESPACE, grace_period_seconds=0),
            lambda: resource.delete_collection_namespaced_resource_claim(NAMESPACE),
        ):
            try:
                call()
            except ApiException as exc:
                if exc.status != 404:
                    raise
        self.plane.forget_node(NODE)
        self.plane.forget_extended_resource_classes()
        shutil.rmtree(self.pipes, ignore_errors=True)


@pytest.fixture(scope="module")
def shares_node(plane: ControlPlane, agent_kubeconfig: Path, scheduler_kubeconfig: Path) -> Iterator[SimNode]:
    plane.apply(plane.kustomize(REPO / "manifests" / "dra"))
    sharing = plane.work / "dra-shares-sharing.yaml"
    pipes = short_temp_dir()  # the daemons' sockets: a unix socket path has at most 107 bytes
    sharing.write_text(yaml.safe_dump({**SHARING, "mpsPipeDirectory": str(pipes)}))
    node = SimNode(
        plane,
        name=NODE,
        profile="l40s-pcie-8",
        agent_kubeconfig=agent_kubeconfig,
        agent_args=("--dra", "--sharing-config", str(sharing)),
    )
    config_path = render_scheduler_config(
        plane, extender_url=None, kubeconfig=scheduler_kubeconfig, scheduler_name=SCHEDULER
    )
    scheduler = start_scheduler(plane, config_path=config_path, name="kube-scheduler-dra-shares")
    controllers = start_controllers(plane)
    with stopping(_Forget(plane, pipes), node, scheduler, controllers):
        wait_for(
            f"{NODE}'s shared devices published",
            lambda: node.agent.alive_and(lambda: {"gpu-0-share", "gpu-1-share"} <= set(_pool(plane))),
            timeout=90,
        )
        add_taint(plane, NODE, TAINT)
        plane.ensure_namespace(NAMESPACE)
        yield node


def _share_claim(name: str, compute: str) -> dict[str, Any]:
    capacity = {"requests": {"compute": compute}}
    request = {"name": "share", "exactly": {"deviceClassName": "gpu-share.gpuweave.io", "capacity": capacity}}
    return {"metadata": {"name": name}, "spec": {"devices": {"requests": [request]}}}


def _pod(name: str, *, claim: str | None = None, resources: dict[str, str] | None = None) -> dict[str, Any]:
    return pod_body(
        name,
        scheduler=SCHEDULER,
        grace_s=1,
        node_selector={"kubernetes.io/hostname": NODE},
        tolerations=[TAINT],
        claims={"gpu": claim} if claim is not None else None,
        limits=resources,
        container="main",
        image="e2e/none",
    )


def _running(plane: ControlPlane, name: str) -> dict[str, Any]:
    """The pod's container allocation once the kubelet's DRA manager prepared its claims."""

    def prepared() -> dict[str, Any] | None:
        pod = plane.core.read_namespaced_pod(name, NAMESPACE)
        if pod.status.phase == "Failed":
            pytest.fail(f"pod {name} failed: {pod.status.reason}: {pod.status.message}")
        allocation = plane.allocation_of(NAMESPACE, name)
        return dict(allocation["containers"]["main"]) if allocation else None

    found: dict[str, Any] = wait_for(f"pod {name} running with its claim prepared", prepared, timeout=90)
    return found


def _result(plane: ControlPlane, claim: str) -> Any:
    found = client.ResourceV1Api(plane.api).read_namespaced_resource_claim(claim, NAMESPACE)
    (result,) = found.status.allocation.devices.results
    return result


def _injected(node: SimNode, got: dict[str, Any]) -> tuple[dict[str, str], list[str]]:
    """The environment and mounts the CDI library injects for the container's CDI devices."""
    status, report = resolve(node.state_dir / "cdi", [{"devices": got["cdiDevices"], "annotations": {}}])
    assert (status, report["specErrors"]) == (0, {}), report
    container = report["containers"][0]
    return dict(e.split("=", 1) for e in container["env"]), list(container["mounts"])


def test_two_claims_share_one_gpu_and_daemon_with_their_own_limits_and_a_third_goes_to_the_next(
    shares_node: SimNode,
) -> None:
    plane = shares_node.plane
    resource = client.ResourceV1Api(plane.api)
    got: dict[str, dict[str, Any]] = {}
    for name, compute in (("share-a", "30"), ("share-b", "50"), ("share-c", "30")):
        resource.create_namespaced_resource_claim(NAMESPACE, _share_claim(name, compute))
        plane.core.create_namespaced_pod(NAMESPACE, _pod(name, claim=name))
        got[name] = _running(plane, name)  # one at a time: the allocator sees the earlier shares
    results = {name: _result(plane, name) for name in got}
    assert [results[n].device for n in ("share-a", "share-b", "share-c")] == [
        "gpu-0-share",
        "gpu-0-share",
        "gpu-1-share",
    ]
    assert {n: r.consumed_capacity["compute"] for n, r in results.items()} == {
        "share-a": "30",
        "share-b": "50",
        "share-c": "30",
    }
    assert len({r.share_id for r in results.values()}) == 3
    daemons = call_agent(shares_node.state_dir, "mps.status", {})["gpus"]
    pool = _pool(plane)
    pipe = {
        name: daemons[pool[name].attributes["uuid"].string]["pipeDirectory"]
        for name in ("gpu-0-share", "gpu-1-share")
    }
    assert all(d["up"] for d in daemons.values())
    for name, limit in (("share-a", "30"), ("share-b", "50"), ("share-c", "30")):
        env, mounts = _injected(shares_node, got[name])
        own = pipe[results[name].device]
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == own, name
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == limit, name
        assert env["NVIDIA_VISIBLE_DEVICES"] == pool[results[name].device].attributes["uuid"].string
        assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in env  # memory was not asked for
        assert f"{own}:{own}" in mounts, mounts
    assert pipe["gpu-0-share"] != pipe["gpu-1-share"]


def test_device_plugin_pod_specs_run_unchanged_through_device_classes(shares_node: SimNode) -> None:
    plane = shares_node.plane
    plane.core.create_namespaced_pod(NAMESPACE, _pod("whole-gpu", resources={"nvidia.com/gpu": "1"}))
    plane.core.create_namespaced_pod(
        NAMESPACE, _pod("gpu-compute", resources={"gpuweave.io/gpu-compute": "30"})
    )
    whole, units = _running(plane, "whole-gpu"), _running(plane, "gpu-compute")
    pool = _pool(plane)
    (gpu,) = [d["device"] for d in whole["claimDevices"]]
    assert pool[gpu].attributes["type"].string == "gpu" and not whole["devices"]  # not the device plugin's
    pod = plane.core.read_namespaced_pod("gpu-compute", NAMESPACE)
    assert (
        pod.status.extended_resource_claim_status.request_mappings[0].resource_name
        == "gpuweave.io/gpu-compute"
    )
    held = [d["device"] for d in units["claimDevices"]]
    indexes = {pool[name].attributes["index"].int for name in held}
    assert len(held) == 30 and len(indexes) == 1, held  # 30 units, all of one GPU
    (index,) = indexes
    assert all(pool[name].attributes["type"].string == "gpu-compute" for name in held)
    assert not [t for name in held for t in pool[name].taints or [] if t.value != "closed"]
    env, mounts = _injected(shares_node, units)
    uuid = pool[f"gpu-{index}-share"].attributes["uuid"].string
    daemon = call_agent(shares_node.state_dir, "mps.status", {})["gpus"][uuid]
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == daemon["pipeDirectory"] and daemon["up"]
    assert env["NVIDIA_VISIBLE_DEVICES"] == uuid
    assert f"{daemon['pipeDirectory']}:{daemon['pipeDirectory']}" in mounts
    # a GPU that serves claims' shares takes no units, and only one GPU's free units stay open
    results = {n: _result(plane, n).device for n in ("share-a", "share-c") if _claim_exists(plane, n)}
    assert f"gpu-{index}-share" not in results.values()

    def closed_elsewhere() -> bool:
        fresh = _pool(plane)
        open_units = {
            d.attributes["index"].int
            for name, d in fresh.items()
            if d.attributes["type"].string == "gpu-compute" and not d.taints
        }
        return len(open_units) <= 1

    wait_for("one GPU's units open", closed_elsewhere, timeout=30)


def _claim_exists(plane: ControlPlane, name: str) -> bool:
    try:
        client.ResourceV1Api(plane.api).read_namespaced_resource_claim(name, NAMESPACE)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def test_the_example_share_claims_are_accepted(shares_node: SimNode) -> None:
    """manifests/dra/example-claims-shares.yaml as the API server stores it: capacity requests kept."""
    dyn = dynamic.DynamicClient(shares_node.plane.api)  # type: ignore[no-untyped-call]
    docs = list(yaml.safe_load_all((REPO / "manifests" / "dra" / "example-claims-shares.yaml").read_text()))
    for doc in docs:
        ControlPlane.apply_one(dyn, {**doc, "metadata": {**doc["metadata"], "namespace": NAMESPACE}})
    stored = client.ResourceV1Api(shares_node.plane.api).read_namespaced_resource_claim_template(
        "gpu-share-30-10gi", NAMESPACE
    )
    (request,) = stored.spec.spec.devices.requests
    assert request.exactly.capacity.requests == {"compute": "30", "memory": "10Gi"}
