"""Long-lived streams never starve the unary calls: with 32 extra ListAndWatch streams open on a
resource's socket, Allocate still answers within the kubelet's 1 s, and the kubelet's own stream
keeps getting updates (real gRPC over unix sockets, the kubelet emulator)."""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from devicemodel.contracts import RESOURCE_GPU
from devicemodel.sharing import SharingPlan
from deviceplugin.frontend import device_plugin_agent
from nodeagent.agent import AgentConfig, NodeAgent
from nodeagent.streams import MAX_STREAMS
from proto.v1beta1 import api_pb2, api_pb2_grpc
from tests.support.kubelet_emulator import KubeletEmulator
from tests.support.small_inventory import gpu_uuid, small_inventory

EXTRA_STREAMS = 32


@pytest.fixture
def node() -> Iterator[tuple[NodeAgent, KubeletEmulator]]:
    root = Path(tempfile.mkdtemp(prefix="gw", dir="/tmp"))
    kubelet = KubeletEmulator(root / "k")
    kubelet.start()
    inventory = small_inventory()
    agent = device_plugin_agent(
        AgentConfig(kubelet_dir=root / "k", state_dir=root / "s", sharing=SharingPlan()),
        discover=lambda: inventory,
    )
    agent.start()
    try:
        assert kubelet.wait_for(lambda: len(kubelet.healthy(RESOURCE_GPU)) == 4, timeout=30)
        yield agent, kubelet
    finally:
        agent.stop()
        kubelet.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_allocate_answers_within_1_s_with_32_extra_list_and_watch_streams(
    node: tuple[NodeAgent, KubeletEmulator],
) -> None:
    agent, kubelet = node
    socket = kubelet.plugin_dir / kubelet.endpoint(RESOURCE_GPU).endpoint
    channel = grpc.insecure_channel(f"unix:{socket}")
    stub = api_pb2_grpc.DevicePluginStub(channel)
    streams = [stub.ListAndWatch(api_pb2.Empty()) for _ in range(EXTRA_STREAMS)]
    refused: list[grpc.StatusCode] = []
    lock = threading.Lock()

    def first_answer(stream: grpc.Future) -> None:  # type: ignore[type-arg]
        try:
            next(stream)  # type: ignore[call-overload]
        except grpc.RpcError as exc:
            with lock:
                refused.append(exc.code())

    readers = [threading.Thread(target=first_answer, args=(s,), daemon=True) for s in streams]
    for reader in readers:
        reader.start()
    try:
        for reader in readers:
            reader.join(timeout=10)
        # the kubelet's stream holds one place: every extra stream past the budget is refused
        assert refused == [grpc.StatusCode.RESOURCE_EXHAUSTED] * (EXTRA_STREAMS - MAX_STREAMS + 1)
        request = api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[gpu_uuid(0)])]
        )
        answer = stub.Allocate(request, timeout=1.0)
        assert len(answer.container_responses) == 1
        agent.set_device_health(gpu_uuid(1), False, "test: Xid 79")
        assert kubelet.wait_for(lambda: gpu_uuid(1) not in kubelet.healthy(RESOURCE_GPU), timeout=10)
    finally:
        for stream in streams:
            stream.cancel()  # type: ignore[attr-defined]
        channel.close()
