"""The real node-agent process, driven by the kubelet emulator over unix sockets."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import yaml

from devicemodel.contracts import (
    RESOURCE_EFA,
    RESOURCE_GPU,
    RESOURCE_GPU_COMPUTE,
    RESOURCE_GPU_MEMORY,
    RESOURCE_GPU_SHARED,
)
from devicemodel.inventory import NicType, NodeInventory
from devicemodel.spec import NodeProfile
from hardware.profiles import builtin_profile_names, load_profile
from proto.v1beta1 import api_pb2
from tests.support.agent_node import AgentNode
from tests.support.agent_process import remove_tree
from tests.support.small_inventory import gpu_uuid, small_inventory


def expected_counts(inventory: NodeInventory) -> dict[str, int]:
    counts = {RESOURCE_GPU: sum(1 for g in inventory.gpus if not g.mig_enabled)}
    efa = sum(1 for n in inventory.nics if n.type is NicType.EFA)
    if efa:
        counts[RESOURCE_EFA] = efa
    return counts


class Node(AgentNode):
    def __init__(self, profile: str, *, extra: tuple[str, ...] = ()) -> None:
        self.inventory = load_profile(profile).to_inventory(node_name="node-a")
        self.expected = expected_counts(self.inventory)
        super().__init__(profile, extra=extra)

    def all_registered(self) -> bool:
        return all(len(self.kubelet.devices(r)) == n for r, n in self.expected.items())

    def close(self) -> None:
        rc = self.agent.stop()
        left = sorted(p.name for p in (self.root / "k").glob("gpuweave-*.sock"))
        self.kubelet.stop()
        remove_tree(self.root)
        assert rc == 0, getattr(self.agent, "stderr", "")
        assert left == [], f"sockets left after SIGTERM: {left}"


@pytest.fixture
def p5() -> Iterator[Node]:
    node = Node("p5.48xlarge")
    try:
        assert node.kubelet.wait_for(node.all_registered, timeout=30)
        yield node
    finally:  # a setup that fails stops the agent too
        node.close()


@pytest.mark.parametrize("profile", builtin_profile_names())
def test_every_builtin_profile_registers_and_allocates(profile: str) -> None:
    node = Node(profile)
    try:
        assert node.kubelet.wait_for(node.all_registered, timeout=30), node.kubelet.rejections
        uuids = {g.uuid: g for g in node.inventory.gpus}
        seen = node.kubelet.devices(RESOURCE_GPU)
        assert set(seen) == set(uuids)
        assert all(d.numa_nodes == (uuids[d.id].numa_node,) for d in seen.values())
        first = min(2, len(uuids))  # a one-GPU host (h200-vm-1) gives its only GPU
        ids, response = node.kubelet.allocate(RESOURCE_GPU, first, numa_hint=[0])
        assert len(set(ids)) == first and set(ids) <= set(uuids)
        assert response.envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(ids)
        rest = len(uuids) - first
        if rest:
            more, _ = node.kubelet.allocate(RESOURCE_GPU, rest)
            assert set(more) == set(uuids) - set(ids)
        if RESOURCE_EFA in node.expected:
            nics, efa = node.kubelet.allocate(RESOURCE_EFA, 1, numa_hint=[1])
            assert [d.host_path for d in efa.devices] == [  # libfabric opens rdma_cm too
                next(n.uverbs_device for n in node.inventory.nics if n.name == nics[0]),
                "/dev/infiniband/rdma_cm",
            ]
    finally:
        node.close()


def abort_code(call: grpc.RpcError) -> grpc.StatusCode:
    return call.code()  # type: ignore[attr-defined, no-any-return]


def test_bad_input_gets_invalid_argument_and_server_keeps_serving(p5: Node) -> None:
    stub = p5.kubelet.stub(RESOURCE_GPU)
    some = sorted(p5.kubelet.devices(RESOURCE_GPU))
    bad_allocates = [
        api_pb2.AllocateRequest(container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=["GPU-x"])]),
        api_pb2.AllocateRequest(container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[])]),
        api_pb2.AllocateRequest(container_requests=[]),
        api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[some[0], some[0]])]
        ),
    ]
    for request in bad_allocates:
        with pytest.raises(grpc.RpcError) as info:
            stub.Allocate(request, timeout=5)
        assert abort_code(info.value) == grpc.StatusCode.INVALID_ARGUMENT
    too_big = api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=some[:2], allocation_size=3)
    zero = api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=some[:2], allocation_size=0)
    for container in (too_big, zero):
        with pytest.raises(grpc.RpcError) as info:
            stub.GetPreferredAllocation(
                api_pb2.PreferredAllocationRequest(container_requests=[container]), timeout=5
            )
        assert abort_code(info.value) == grpc.StatusCode.INVALID_ARGUMENT
        assert "size" in info.value.details()  # type: ignore[attr-defined]
    raw = p5.kubelet.endpoint(RESOURCE_GPU).channel.unary_unary("/v1beta1.DevicePlugin/Allocate")
    with pytest.raises(grpc.RpcError) as info:
        raw(b"\xff\xff\xff", timeout=5)
    assert abort_code(info.value) == grpc.StatusCode.INVALID_ARGUMENT
    ids, _ = p5.kubelet.allocate(RESOURCE_GPU, 8)
    assert sorted(ids) == some


def test_preferred_allocation_prefers_nics_on_the_gpus_numa_node(p5: Node) -> None:
    ids, _ = p5.kubelet.allocate(RESOURCE_EFA, 4, numa_hint=[1])
    nics = {n.name: n for n in p5.inventory.nics}
    assert {nics[i].numa_node for i in ids} == {1}


def test_kubelet_restarts_keep_ids_and_leak_nothing(p5: Node) -> None:
    before = {r: set(p5.kubelet.devices(r)) for r in p5.expected}
    p5.kubelet.restart()
    assert p5.kubelet.wait_for(p5.all_registered, timeout=10)
    fds, threads = p5.agent.fd_count(), p5.agent.thread_count()
    for round_number in range(100):
        p5.kubelet.restart()
        assert p5.kubelet.wait_for(p5.all_registered, timeout=10), f"round {round_number}"
    assert {r: set(p5.kubelet.devices(r)) for r in p5.expected} == before
    assert p5.agent.fd_count() <= fds + 2
    assert p5.agent.thread_count() <= threads + 2
    assert p5.kubelet.registrations.count(RESOURCE_GPU) >= 102


def test_agent_rebinds_its_socket_when_deleted(p5: Node) -> None:
    socket_path = Path(p5.kubelet.plugin_dir) / "gpuweave-gpu.sock"
    registrations = p5.kubelet.registrations.count(RESOURCE_GPU)
    socket_path.unlink()
    assert p5.kubelet.wait_for(
        lambda: p5.kubelet.registrations.count(RESOURCE_GPU) > registrations, timeout=15
    )
    assert socket_path.exists()
    # the new registration's ListAndWatch lists the devices a moment after it
    assert p5.kubelet.wait_for(lambda: len(p5.kubelet.healthy(RESOURCE_GPU)) == 8, timeout=15)
    ids, _ = p5.kubelet.allocate(RESOURCE_GPU, 1)
    assert len(ids) == 1


def test_profile_file_with_mig_and_a_sharing_config(tmp_path: Path) -> None:
    profile = tmp_path / "mig-node.yaml"
    profile.write_text(yaml.safe_dump(NodeProfile.from_inventory(small_inventory(mig_on=(1,))).to_wire()))
    sharing = tmp_path / "sharing.yaml"
    sharing.write_text("gpus:\n  '3': {mode: fractional}\n  '2': {mode: time-sliced, replicas: 3}\n")
    node = Node(str(profile), extra=("--sharing-config", str(sharing)))
    node.expected = {
        RESOURCE_GPU: 1,
        "nvidia.com/mig-3g.40gb": 2,
        RESOURCE_EFA: 2,
        RESOURCE_GPU_COMPUTE: 100,
        RESOURCE_GPU_MEMORY: 80,
        RESOURCE_GPU_SHARED: 3,
    }
    try:
        assert node.kubelet.wait_for(node.all_registered, timeout=30), node.kubelet.rejections
        ids, response = node.kubelet.allocate("nvidia.com/mig-3g.40gb", 1)
        assert ids[0].startswith("MIG-") and response.envs["NVIDIA_VISIBLE_DEVICES"] == ids[0]
        assert response.cdi_devices[0].name == f"nvidia.com/gpu={ids[0]}"
        _, replica = node.kubelet.allocate(RESOURCE_GPU_SHARED, 1)
        assert replica.envs["NVIDIA_VISIBLE_DEVICES"] == gpu_uuid(2)
        _, compute = node.kubelet.allocate(RESOURCE_GPU_COMPUTE, 40)
        pipe = str(node.state_dir / "mps" / gpu_uuid(3) / "pipe")  # GPU 3's own MPS daemon
        assert compute.envs == {
            "NVIDIA_VISIBLE_DEVICES": gpu_uuid(3),
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "40",
            "CUDA_MPS_PIPE_DIRECTORY": pipe,
        }
    finally:
        node.close()
