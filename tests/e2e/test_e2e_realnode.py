"""One real node: the full kubelet, containerd and runc start containers with the devices gpuweave
allocated, and each test asserts what the process inside the container saw.

Real parts: ``harness realnode`` (k8s.io/kubernetes/cmd/kubelet at the pinned version, containerd
2.x with CDI, runc; tests/e2e/realnode), the e2e control plane, upstream kube-scheduler with the
gpuweave-scheduler profile and ``gpuweave extender``, and ``gpuweave node-agent --simulate``
serving the kubelet over its real device-plugin socket and writing the CDI specs containerd
reads. The GPUs are simulated (no NVIDIA driver here), so their device nodes are created by runc
from the CDI specs' numbers; the container reports them with their major:minor and the device
cgroup's allow list. See docs/e2e.md ("realnode").
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from devicemodel.contracts import RESOURCE_EFA, RESOURCE_GPU, RESOURCE_GPU_COMPUTE, mig_resource_name
from tests.e2e.cluster import (
    REPO,
    ControlPlane,
    Process,
    free_port,
    gpuweave_command,
    render_scheduler_config,
    start_extender,
    start_scheduler,
    wait_for,
)
from tests.e2e.realnode import (
    NVIDIA_MAJOR,
    REALNODE_TAINT,
    RealNode,
    allocatable_ids,
    allowed_gpu_minors,
    container_id,
    delete_all_pods,
    delete_pod,
    gpu_nodes,
    gpus_by_uuid,
    pod_or_none,
    run_seer,
    seer_pod,
    wait_reported,
)
from tests.e2e.realnode import SEER_NAMESPACE as NAMESPACE
from tests.e2e.realnode import SEER_SCHEDULER as SCHEDULER
from tests.support.agent_node import run_sim_inject
from tests.support.agent_process import short_temp_dir

pytestmark = pytest.mark.realnode

NODE = "e2e-realnode"
PROFILE = "p5.48xlarge"  # 8 MIG-capable H100, 32 EFA adapters
MPS_GPU = 6  # fractional (MPS): served as gpuweave.io/gpu-compute shares
MPS_SHARING = {"mode": "fractional", "mps": {"defaultActiveThreadPercentage": 40}}
MIG_GPU = 7  # split by the gpuweave.io/mig-layout annotation
MIG_3G = mig_resource_name("3g.40gb")
WHOLE_GPUS = 6  # the others are shared or split
EVICTION_GRACE_S = 2


class Agent:
    """``gpuweave node-agent --simulate`` on the real node's kubelet socket, restartable."""

    def __init__(self, plane: ControlPlane, node: RealNode, kubeconfig: Path) -> None:
        self.plane, self.node = plane, node
        self.state = short_temp_dir()  # MPS pipe directories hold unix sockets
        sharing = node.dir / "sharing.yaml"
        sharing.write_text(yaml.safe_dump({"kind": "SharingConfig", "gpus": {str(MPS_GPU): MPS_SHARING}}))
        health = node.dir / "health.yaml"
        settings = {"round_interval_s": 1, "startup_rounds": 1, "eviction_grace_s": EVICTION_GRACE_S}
        health.write_text(yaml.safe_dump({"health": settings}))
        self.argv = [
            *gpuweave_command(),
            "node-agent",
            "--simulate",
            PROFILE,
            "--node-name",
            NODE,
            "--kubelet-dir",
            str(node.plugin_dir),
            "--state-dir",
            str(self.state),
            "--cdi-spec-dir",
            str(node.cdi_dir),
            "--sharing-config",
            str(sharing),
            "--health-config",
            str(health),
            "--kubeconfig",
            str(kubeconfig),
        ]
        self.starts = 0
        self.process = self._start()

    def _start(self) -> Process:
        self.starts += 1
        return Process(f"node-agent-{NODE}-{self.starts}", self.argv, log_dir=self.plane.work)

    def restart(self, *extra: str) -> None:
        """Stop the agent and start it again on the same state, ``extra`` added to its arguments."""
        self.process.stop()
        self.argv = [*self.argv, *extra]
        self.process = self._start()

    def stop(self) -> None:
        self.process.stop()
        shutil.rmtree(self.state, ignore_errors=True)


@pytest.fixture(scope="module")
def realnode(plane: ControlPlane, agent_kubeconfig: Path, scheduler_kubeconfig: Path) -> Iterator[RealNode]:
    """The real node with the simulated node agent on its kubelet socket, and a scheduler of its own
    (the gpuweave-scheduler profile renamed, with its own extender). GPU 7 is split into two
    3g.40gb MIG devices, GPU 6 is shared through MPS."""
    plane.ensure_namespace(NAMESPACE)
    node = RealNode(plane, name=NODE, kubelet_port=free_port(), profile=PROFILE, taints=REALNODE_TAINT)
    started: list[Any] = [node]
    try:
        agent = Agent(plane, node, agent_kubeconfig)
        started.append(agent)
        node.agent = agent.process
        extender, url = start_extender(plane, kubeconfig=scheduler_kubeconfig, name="extender-realnode")
        started.append(extender)
        config = render_scheduler_config(
            plane, extender_url=url, kubeconfig=scheduler_kubeconfig, scheduler_name=SCHEDULER
        )
        started.append(start_scheduler(plane, config_path=config, name="kube-scheduler-realnode"))
        layout = {"gpus": {str(MIG_GPU): ["3g.40gb", "3g.40gb"]}}
        plane.core.patch_node(
            NODE, {"metadata": {"annotations": {"gpuweave.io/mig-layout": json.dumps(layout)}}}
        )
        wait_allocatable(node, agent, {RESOURCE_GPU: WHOLE_GPUS, MIG_3G: 2, RESOURCE_EFA: 32}, timeout=120)

        def health_done() -> bool:
            taints = plane.core.read_node(NODE).spec.taints or []
            return not any(t.key == "gpuweave.io/health-pending" for t in taints)

        wait_for(f"{NODE}'s agent health start-up", lambda: agent.process.alive_and(health_done), timeout=60)
        node.agent_handle = agent
        yield node
    finally:
        for thing in reversed(started):
            thing.stop()


@pytest.fixture(autouse=True)
def no_pods_left(realnode: RealNode) -> Iterator[None]:
    """Each test starts on an empty node, whatever the previous one left."""
    yield
    delete_all_pods(realnode)


def wait_allocatable(node: RealNode, agent: Agent, wanted: dict[str, int], *, timeout: float = 60) -> None:
    def reached() -> bool:
        allocatable = node.plane.core.read_node(NODE).status.allocatable or {}
        return all(allocatable.get(r) == str(n) for r, n in wanted.items())

    wait_for(f"{NODE} allocatable {wanted}", lambda: agent.process.alive_and(reached), timeout=timeout)


def test_two_gpu_pod_sees_exactly_its_two_gpus(realnode: RealNode) -> None:
    pod, seen = run_seer(realnode, "seer-2gpu", {RESOURCE_GPU: "2"})
    assert pod.spec.node_name == NODE
    gpus = gpus_by_uuid(realnode)
    visible = seen["env"]["NVIDIA_VISIBLE_DEVICES"].split(",")
    assert len(visible) == 2 and set(visible) <= set(gpus), visible
    minors = {int(gpus[u]["minor"]) for u in visible}
    assert gpu_nodes(seen) == {f"/dev/nvidia{m}": (NVIDIA_MAJOR, m) for m in minors}
    assert allowed_gpu_minors(seen) == minors
    assert {"/dev/nvidiactl", "/dev/nvidia-uvm"} <= {d["path"] for d in seen["devices"]}
    delete_pod(realnode, "seer-2gpu")


def test_mig_pod_sees_its_slice_and_only_the_parent_gpu(realnode: RealNode) -> None:
    _, seen = run_seer(realnode, "seer-mig", {MIG_3G: "1"})
    visible = seen["env"]["NVIDIA_VISIBLE_DEVICES"].split(",")
    assert len(visible) == 1 and visible[0].startswith("MIG-"), visible
    mig_minor = next(int(g["minor"]) for g in gpus_by_uuid(realnode).values() if int(g["index"]) == MIG_GPU)
    assert gpu_nodes(seen) == {f"/dev/nvidia{mig_minor}": (NVIDIA_MAJOR, mig_minor)}
    assert allowed_gpu_minors(seen) == {mig_minor}
    caps = [d for d in seen["devices"] if d["path"].startswith("/dev/nvidia-caps/")]
    assert len(caps) == 2, caps  # the slice's GPU-instance and compute-instance access nodes
    delete_pod(realnode, "seer-mig")


def test_fractional_pod_gets_its_mps_pipe_and_limits(realnode: RealNode) -> None:
    _, seen = run_seer(realnode, "seer-mps", {RESOURCE_GPU_COMPUTE: "30"})
    env = seen["env"]
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    pipe = env["CUDA_MPS_PIPE_DIRECTORY"]
    assert pipe in seen["mounts"], seen["mounts"]
    assert seen["mps"]["pipeDirectory"] == pipe and not seen["mps"].get("error")
    assert seen["mps"]["entries"], "the MPS daemon's pipe directory is empty in the container"
    # a client in the container reaches the GPU's control daemon through the mounted pipe directory
    assert not seen["mps"].get("controlError"), seen["mps"]
    assert float(seen["mps"]["defaultActiveThreadPercentage"]) == 40, seen["mps"]  # MPS_SHARING's
    mps_minor = next(int(g["minor"]) for g in gpus_by_uuid(realnode).values() if int(g["index"]) == MPS_GPU)
    assert gpu_nodes(seen) == {f"/dev/nvidia{mps_minor}": (NVIDIA_MAJOR, mps_minor)}
    delete_pod(realnode, "seer-mps")


def test_efa_pod_sees_its_uverbs_device(realnode: RealNode) -> None:
    _, seen = run_seer(realnode, "seer-efa", {RESOURCE_EFA: "1"})
    uverbs = [d for d in seen["devices"] if d["path"].startswith("/dev/infiniband/uverbs")]
    assert len(uverbs) == 1, seen["devices"]
    numbers = f"c {uverbs[0]['major']}:{uverbs[0]['minor']} "
    assert [r for r in seen["deviceCgroup"] if r.startswith(numbers)], seen["deviceCgroup"]
    assert "/dev/infiniband/rdma_cm" in {d["path"] for d in seen["devices"]}
    assert not gpu_nodes(seen)
    delete_pod(realnode, "seer-efa")


def test_kubelet_restart_keeps_running_containers_and_their_devices(realnode: RealNode) -> None:
    before, seen = run_seer(realnode, "seer-kept", {RESOURCE_GPU: "4"})
    kept = set(seen["env"]["NVIDIA_VISIBLE_DEVICES"].split(","))
    realnode.restart_kubelet()
    agent = realnode.agent_handle
    wait_allocatable(realnode, agent, {RESOURCE_GPU: WHOLE_GPUS})
    after = realnode.plane.core.read_namespaced_pod("seer-kept", NAMESPACE)
    assert container_id(after) == container_id(before)
    assert after.status.container_statuses[0].restart_count == 0
    _, second = run_seer(realnode, "seer-after-restart", {RESOURCE_GPU: "2"})
    taken = set(second["env"]["NVIDIA_VISIBLE_DEVICES"].split(","))
    assert len(taken) == 2 and not taken & kept, (taken, kept)
    for name in ("seer-kept", "seer-after-restart"):
        delete_pod(realnode, name)


def test_agent_restart_reregisters_the_same_device_ids(realnode: RealNode) -> None:
    agent = realnode.agent_handle
    resources = (RESOURCE_GPU, MIG_3G, RESOURCE_EFA, RESOURCE_GPU_COMPUTE)
    before = {r: allocatable_ids(realnode, r) for r in resources}
    assert all(before.values()), before
    running, _ = run_seer(realnode, "seer-across-agent", {RESOURCE_GPU: "1"})
    agent.restart()

    def same_ids() -> bool:
        return {r: allocatable_ids(realnode, r) for r in resources} == before

    wait_for(
        "the kubelet to hold the same device IDs again", lambda: agent.process.alive_and(same_ids), timeout=90
    )
    still = realnode.plane.core.read_namespaced_pod("seer-across-agent", NAMESPACE)
    assert container_id(still) == container_id(running)
    delete_pod(realnode, "seer-across-agent")


def test_xid_79_evicts_only_the_pod_on_that_gpu(realnode: RealNode) -> None:
    agent = realnode.agent_handle
    _, victim_seen = run_seer(realnode, "seer-victim", {RESOURCE_GPU: "1"})
    bystander, _ = run_seer(realnode, "seer-bystander", {RESOURCE_GPU: "1"})
    (failed_uuid,) = victim_seen["env"]["NVIDIA_VISIBLE_DEVICES"].split(",")
    failed_index = int(gpus_by_uuid(realnode)[failed_uuid]["index"])

    run_sim_inject(agent.state, "--gpu", str(failed_index), "--xid", "79").check_returncode()

    wait_for(
        "the victim pod to be gone",
        lambda: agent.process.alive_and(lambda: pod_or_none(realnode, "seer-victim") is None),
        timeout=90,
    )
    kept = realnode.plane.core.read_namespaced_pod("seer-bystander", NAMESPACE)
    assert kept.metadata.deletion_timestamp is None and kept.status.phase == "Running"
    assert container_id(kept) == container_id(bystander)
    assert kept.status.container_statuses[0].restart_count == 0
    wait_allocatable(realnode, agent, {RESOURCE_GPU: WHOLE_GPUS - 1})
    _, after = run_seer(realnode, "seer-after-fault", {RESOURCE_GPU: "4"})
    assert failed_uuid not in after["env"]["NVIDIA_VISIBLE_DEVICES"].split(",")
    for name in ("seer-bystander", "seer-after-fault"):
        delete_pod(realnode, name)


def dra_pool(realnode: RealNode) -> Callable[[], dict[str, Any]]:
    """The agent in DRA mode (restarted with --dra the first time), and a reader of its pool."""
    plane, agent = realnode.plane, realnode.agent_handle
    resource = client.ResourceV1Api(plane.api)

    def pool() -> dict[str, Any]:
        found = resource.list_resource_slice(field_selector=f"spec.nodeName={NODE}").items
        return {d.name: d for s in found for d in s.spec.devices or []}

    if "--dra" not in agent.argv:
        plane.apply(plane.kustomize(REPO / "manifests" / "dra"))
        agent.restart("--dra")
    wait_for(f"{NODE}'s ResourceSlices", lambda: agent.process.alive_and(lambda: bool(pool())), timeout=90)
    return pool


def run_claim_seer(realnode: RealNode, name: str, request: dict[str, Any]) -> dict[str, Any]:
    """A seer pod whose one claim (``name``) has ``request``; what its container saw."""
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [request]}},
    }
    client.ResourceV1Api(realnode.plane.api).create_namespaced_resource_claim(NAMESPACE, claim)
    pod = seer_pod(name, {}, realnode.name)
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": name}]
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    realnode.plane.core.create_namespaced_pod(NAMESPACE, pod)
    return wait_reported(realnode, name)[1]


def test_dra_claim_pod_sees_its_allocated_gpu(realnode: RealNode) -> None:
    """Last: the agent restarts with --dra and serves every device through DRA instead."""
    plane = realnode.plane
    pool = dra_pool(realnode)
    resource = client.ResourceV1Api(plane.api)
    request = {"name": "gpu", "exactly": {"deviceClassName": "gpu.gpuweave.io"}}
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "realnode-gpu"},
        "spec": {"devices": {"requests": [request]}},
    }
    resource.create_namespaced_resource_claim(NAMESPACE, claim)
    pod = seer_pod("seer-dra", {}, realnode.name)
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "realnode-gpu"}]
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    plane.core.create_namespaced_pod(NAMESPACE, pod)
    _, seen = wait_reported(realnode, "seer-dra")

    allocated = resource.read_namespaced_resource_claim("realnode-gpu", NAMESPACE).status.allocation
    (result,) = allocated.devices.results
    assert (result.driver, result.pool) == ("gpuweave.io", NODE)
    uuid = pool()[result.device].attributes["uuid"].string
    minor = int(gpus_by_uuid(realnode)[uuid]["minor"])
    assert gpu_nodes(seen) == {f"/dev/nvidia{minor}": (NVIDIA_MAJOR, minor)}
    assert allowed_gpu_minors(seen) == {minor}


def test_dra_share_claim_pod_gets_its_mps_pipe_and_limits(realnode: RealNode) -> None:
    """In DRA mode the fractional GPU is one device claims share: a claim for 30 compute units and
    8 GiB gets the GPU's MPS pipe directory, mounted by containerd from the claim's CDI spec with
    the daemon answering in it, and exactly those limits, as the device plugin's grant gives them."""
    pool = dra_pool(realnode)
    capacity = {"requests": {"compute": "30", "memory": "8Gi"}}
    share = {"deviceClassName": "gpu-share.gpuweave.io", "capacity": capacity}
    seen = run_claim_seer(realnode, "seer-dra-share", {"name": "gpu", "exactly": share})
    resource = client.ResourceV1Api(realnode.plane.api)
    claim = resource.read_namespaced_resource_claim("seer-dra-share", NAMESPACE)
    (result,) = claim.status.allocation.devices.results
    assert result.device == f"gpu-{MPS_GPU}-share" and result.consumed_capacity["compute"] == "30"
    env = seen["env"]
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=8G"
    assert env["NVIDIA_VISIBLE_DEVICES"] == pool()[result.device].attributes["uuid"].string
    pipe = env["CUDA_MPS_PIPE_DIRECTORY"]
    assert pipe in seen["mounts"], seen["mounts"]
    assert seen["mps"]["pipeDirectory"] == pipe and not seen["mps"].get("controlError"), seen["mps"]
    assert float(seen["mps"]["defaultActiveThreadPercentage"]) == 40, seen["mps"]  # MPS_SHARING's
    minor = next(int(g["minor"]) for g in gpus_by_uuid(realnode).values() if int(g["index"]) == MPS_GPU)
    assert gpu_nodes(seen) == {f"/dev/nvidia{minor}": (NVIDIA_MAJOR, minor)}
    delete_pod(realnode, "seer-dra-share")
