"""The pod-resources client against a real gRPC ``v1.PodResourcesLister`` on a unix socket.

It maps every allocated device to its pod, fails loudly (never "nothing in use") when the socket is
missing, the server is gone or stops answering, and the busy set the MIG manager reads joins the
kubelet's list with the agent's recent Allocate grants.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from devicemodel.assignment import device_id_share
from nodeagent.podresources import (
    AllocationLog,
    HeldDevices,
    PodRef,
    PodResourcesClient,
    PodResourcesUnavailableError,
    default_socket_for,
)
from proto.podresources.v1 import api_pb2, api_pb2_grpc
from tests.support.agent_process import short_temp_dir
from tests.support.podresources_server import PodResourcesServer

MIG_3G = "nvidia.com/mig-3g.40gb"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    root = short_temp_dir()
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def server(socket_dir: Path) -> Iterator[PodResourcesServer]:
    with PodResourcesServer(socket_dir / "pod-resources" / "kubelet.sock") as running:
        yield running


def test_list_devices_maps_every_allocated_device_to_its_pod(server: PodResourcesServer) -> None:
    gpus = {"nvidia.com/gpu": ["GPU-1", "GPU-2"]}
    server.admit("ml", "trainer", {"main": gpus, "side": {MIG_3G: ["MIG-a"]}})
    server.admit("web", "idle", {"main": {}})
    client = PodResourcesClient(server.socket_path, timeout=5)
    assert client.list_devices() == {
        "GPU-1": PodRef("ml", "trainer", "main", "nvidia.com/gpu"),
        "GPU-2": PodRef("ml", "trainer", "main", "nvidia.com/gpu"),
        "MIG-a": PodRef("ml", "trainer", "side", MIG_3G),
    }
    assert client.pod_devices() == {("ml", "trainer"): frozenset({"GPU-1", "GPU-2", "MIG-a"})}
    server.remove("ml", "trainer")
    assert client.list_devices() == {}


def test_the_test_server_answers_get_and_allocatable_as_the_kubelet(server: PodResourcesServer) -> None:
    server.allocatable = {"nvidia.com/gpu": ["GPU-1", "GPU-2"]}
    server.admit("ml", "trainer", {"main": {"nvidia.com/gpu": ["GPU-1"]}})
    with grpc.insecure_channel(f"unix://{server.socket_path}") as channel:
        stub = api_pb2_grpc.PodResourcesListerStub(channel)
        allocatable = stub.GetAllocatableResources(api_pb2.AllocatableResourcesRequest(), timeout=5)
        assert [(d.resource_name, list(d.device_ids)) for d in allocatable.devices] == [
            ("nvidia.com/gpu", ["GPU-1", "GPU-2"])
        ]
        one = stub.Get(api_pb2.GetPodResourcesRequest(pod_name="trainer", pod_namespace="ml"), timeout=5)
        assert one.pod_resources.containers[0].devices[0].device_ids == ["GPU-1"]
        with pytest.raises(grpc.RpcError) as missing:
            stub.Get(api_pb2.GetPodResourcesRequest(pod_name="gone", pod_namespace="ml"), timeout=5)
        assert missing.value.code() is grpc.StatusCode.NOT_FOUND


def test_missing_socket_is_reported_not_read_as_nothing_in_use(socket_dir: Path) -> None:
    client = PodResourcesClient(socket_dir / "pod-resources" / "kubelet.sock", timeout=1)
    with pytest.raises(PodResourcesUnavailableError, match=r"kubelet.sock: the socket does not exist"):
        client.list_devices()


def test_a_kubelet_that_went_away_is_reported(server: PodResourcesServer) -> None:
    client = PodResourcesClient(server.socket_path, timeout=1)
    server.admit("ml", "trainer", {"main": {"nvidia.com/gpu": ["GPU-1"]}})
    assert client.list_devices()
    server.stop()
    server.socket_path.touch()  # a stale file where the socket was: connecting fails
    with pytest.raises(PodResourcesUnavailableError, match=r"List failed: UNAVAILABLE"):
        client.list_devices()


def test_a_kubelet_that_stops_answering_times_out(server: PodResourcesServer) -> None:
    client = PodResourcesClient(server.socket_path, timeout=0.3)
    server.hold()
    try:
        with pytest.raises(PodResourcesUnavailableError, match=r"DEADLINE_EXCEEDED.*deadline 0.3 s"):
            client.list_devices()
    finally:
        server.release()
    assert client.list_devices() == {}


def test_held_devices_join_the_kubelet_list_with_recent_grants(server: PodResourcesServer) -> None:
    clock = FakeClock()
    grants = AllocationLog(clock)
    share = device_id_share("MIG-b", "compute", 3)
    server.admit("ml", "trainer", {"main": {MIG_3G: ["MIG-a"], "gpuweave.io/gpu-compute": [share]}})
    held = HeldDevices(PodResourcesClient(server.socket_path, timeout=5), grants, grace_s=10)
    assert held() == {"MIG-a", share, "MIG-b"}  # a share also holds the device it is cut from
    grants.record(["MIG-c"])  # granted, not yet listed by the kubelet
    assert "MIG-c" in held()
    clock.now += 11
    assert "MIG-c" not in held()  # the window passed: the kubelet's list is the truth again
    assert grants.device_ids() == {"MIG-c"}  # still remembered as granted since start


def test_held_devices_fail_closed_when_the_kubelet_cannot_be_read(socket_dir: Path) -> None:
    held = HeldDevices(PodResourcesClient(socket_dir / "absent.sock", timeout=1), AllocationLog())
    with pytest.raises(PodResourcesUnavailableError):
        held()
    assert HeldDevices(None, AllocationLog()).__call__() == frozenset()  # no socket configured


@pytest.mark.parametrize(
    ("kubelet_dir", "expected"),
    [
        ("/var/lib/kubelet/device-plugins", "/var/lib/kubelet/pod-resources/kubelet.sock"),
        ("/data/kubelet/device-plugins", "/data/kubelet/pod-resources/kubelet.sock"),
        ("/tmp/plugins", None),
    ],
)
def test_default_socket_sits_beside_the_device_plugin_dir(kubelet_dir: str, expected: str | None) -> None:
    found = default_socket_for(Path(kubelet_dir))
    assert (str(found) if found else None) == expected
