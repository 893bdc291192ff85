"""The in-process NodeAgent against the kubelet emulator over real unix sockets."""

from __future__ import annotations

import json
import select
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from devicemodel.contracts import RESOURCE_EFA, RESOURCE_GPU, RESOURCE_GPU_COMPUTE, RESOURCE_GPU_MEMORY
from devicemodel.inventory import NodeInventory
from devicemodel.sharing import GpuSharing, SharingMode, SharingPlan
from deviceplugin.frontend import device_plugin_agent
from nodeagent.agent import AgentConfig, NodeAgent
from nodeagent.control import CONTROL_SOCKET, MAX_CONNECTIONS, REQUEST_DEADLINE_S, call_agent, send_request
from nodeagent.errors import ControlError
from proto.v1beta1 import api_pb2
from tests.support.kubelet_emulator import KubeletEmulator
from tests.support.small_inventory import gpu_uuid, small_inventory


@pytest.fixture
def dirs() -> Iterator[tuple[Path, Path]]:
    root = Path(tempfile.mkdtemp(prefix="gw", dir="/tmp"))
    yield root / "k", root / "s"
    shutil.rmtree(root, ignore_errors=True)


class Holder:
    """A mutable inventory the agent re-discovers from (stands in for the hardware backend)."""

    def __init__(self, inventory: NodeInventory) -> None:
        self.inventory = inventory

    def discover(self) -> NodeInventory:
        return self.inventory


class FlakyHolder(Holder):
    """Discovery that can fail (an NVML error) without taking the lists away."""

    failing = False

    def discover(self) -> NodeInventory:
        if self.failing:
            raise RuntimeError("NVML: GPU is lost")
        return self.inventory


def start(
    dirs: tuple[Path, Path], holder: Holder, sharing: SharingPlan | None = None
) -> tuple[NodeAgent, KubeletEmulator]:
    kubelet_dir, state_dir = dirs
    kubelet = KubeletEmulator(kubelet_dir)
    kubelet.start()
    config = AgentConfig(kubelet_dir=kubelet_dir, state_dir=state_dir, sharing=sharing or SharingPlan())
    agent = device_plugin_agent(config, discover=holder.discover)
    agent.start()
    return agent, kubelet


@pytest.fixture
def running(dirs: tuple[Path, Path]) -> Iterator[tuple[NodeAgent, KubeletEmulator, Holder]]:
    holder = Holder(small_inventory())
    agent, kubelet = start(dirs, holder)
    yield agent, kubelet, holder
    agent.stop()
    kubelet.stop()


def test_registers_and_streams_gpus_with_numa(running: tuple[NodeAgent, KubeletEmulator, Holder]) -> None:
    agent, kubelet, _ = running
    assert kubelet.wait_for(
        lambda: len(kubelet.devices(RESOURCE_GPU)) == 4 and len(kubelet.devices(RESOURCE_EFA)) == 2
    )
    devices = kubelet.devices(RESOURCE_GPU)
    assert devices[gpu_uuid(0)].numa_nodes == (0,)
    assert devices[gpu_uuid(3)].numa_nodes == (1,)
    assert all(d.health == "Healthy" for d in devices.values())
    assert (agent.config.kubelet_dir / "gpuweave-gpu.sock").stat().st_mode & 0o777 == 0o600
    assert (agent.config.state_dir / CONTROL_SOCKET).stat().st_mode & 0o777 == 0o600


def test_allocate_returns_env_and_cdi(running: tuple[NodeAgent, KubeletEmulator, Holder]) -> None:
    _, kubelet, _ = running
    assert kubelet.wait_for(lambda: len(kubelet.devices(RESOURCE_GPU)) == 4)
    ids, response = kubelet.allocate(RESOURCE_GPU, 2)
    assert sorted(ids) in ([gpu_uuid(0), gpu_uuid(1)], [gpu_uuid(2), gpu_uuid(3)])  # an NVLink pair
    assert response.envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(ids)
    assert [c.name for c in response.cdi_devices] == [f"nvidia.com/gpu={i}" for i in ids]


def test_efa_follows_the_gpus_just_allocated(running: tuple[NodeAgent, KubeletEmulator, Holder]) -> None:
    _, kubelet, _ = running
    assert kubelet.wait_for(
        lambda: len(kubelet.devices(RESOURCE_GPU)) == 4 and len(kubelet.devices(RESOURCE_EFA)) == 2
    )
    gpus, _ = kubelet.allocate(RESOURCE_GPU, 1, numa_hint=[1])
    assert gpus[0] in (gpu_uuid(2), gpu_uuid(3))
    nics, _ = kubelet.allocate(RESOURCE_EFA, 1)  # no hint: the agent puts it beside that GPU
    assert nics == ["rdmap17s0"]


def test_efa_allocate_returns_only_its_uverbs(running: tuple[NodeAgent, KubeletEmulator, Holder]) -> None:
    _, kubelet, _ = running
    assert kubelet.wait_for(lambda: len(kubelet.devices(RESOURCE_EFA)) == 2)
    ids, response = kubelet.allocate(RESOURCE_EFA, 1, numa_hint=[1])
    assert ids == ["rdmap17s0"]
    assert [(d.container_path, d.host_path) for d in response.devices] == [
        ("/dev/infiniband/uverbs1", "/dev/infiniband/uverbs1")
    ]
    assert "NVIDIA_VISIBLE_DEVICES" not in response.envs


def test_unknown_id_is_invalid_argument_and_server_keeps_serving(
    running: tuple[NodeAgent, KubeletEmulator, Holder],
) -> None:
    _, kubelet, _ = running
    assert kubelet.wait_for(lambda: len(kubelet.devices(RESOURCE_GPU)) == 4)
    stub = kubelet.stub(RESOURCE_GPU)
    bad = api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=["GPU-nope"])]
    )
    with pytest.raises(grpc.RpcError) as info:
        stub.Allocate(bad, timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert "GPU-nope" in info.value.details()  # type: ignore[attr-defined]
    ids, _ = kubelet.allocate(RESOURCE_GPU, 1)
    assert len(ids) == 1


def test_health_fault_on_gpu_streams_unhealthy_and_recovers(
    running: tuple[NodeAgent, KubeletEmulator, Holder],
) -> None:
    agent, kubelet, _ = running
    assert kubelet.wait_for(lambda: len(kubelet.healthy(RESOURCE_GPU)) == 4)
    agent.set_device_health(gpu_uuid(2), False, "Xid 79")
    assert kubelet.wait_for(lambda: kubelet.healthy(RESOURCE_GPU) == {gpu_uuid(i) for i in (0, 1, 3)})
    agent.withhold([gpu_uuid(0)], "suspect")
    assert kubelet.wait_for(lambda: kubelet.healthy(RESOURCE_GPU) == {gpu_uuid(i) for i in (1, 3)})
    agent.set_device_health(gpu_uuid(2), True)
    agent.release([gpu_uuid(0)])
    assert kubelet.wait_for(lambda: len(kubelet.healthy(RESOURCE_GPU)) == 4)


def test_mig_reshape_adds_resource_and_empties_others_without_restart(
    running: tuple[NodeAgent, KubeletEmulator, Holder],
) -> None:
    agent, kubelet, holder = running
    assert kubelet.wait_for(lambda: len(kubelet.devices(RESOURCE_GPU)) == 4)
    gpu_stream = kubelet.endpoint(RESOURCE_GPU)
    holder.inventory = small_inventory(mig_on=(3,))
    agent.refresh_inventory()
    mig = "nvidia.com/mig-3g.40gb"
    assert kubelet.wait_for(
        lambda: len(kubelet.devices(mig)) == 2 and len(kubelet.devices(RESOURCE_GPU)) == 3
    )
    assert kubelet.endpoint(RESOURCE_GPU) is gpu_stream  # same registration, list updated in place
    ids, response = kubelet.allocate(mig, 1)
    assert response.envs["NVIDIA_VISIBLE_DEVICES"] == ids[0]
    holder.inventory = small_inventory()
    agent.refresh_inventory()
    assert kubelet.wait_for(lambda: kubelet.devices(mig) == {} and kubelet.endpoint(mig).updates >= 2)
    assert mig in kubelet.resources()  # still registered, streaming an empty list


def test_control_socket_routes(running: tuple[NodeAgent, KubeletEmulator, Holder]) -> None:
    agent, kubelet, _ = running
    assert kubelet.wait_for(lambda: all(agent.registered().get(r) for r in (RESOURCE_GPU, RESOURCE_EFA)))
    status = call_agent(agent.config.state_dir, "agent.status")
    assert status["resources"][RESOURCE_GPU]["devices"] == 4
    agent.control.add_route("test.echo", lambda params: {"echo": params})
    assert call_agent(agent.config.state_dir, "test.echo", {"x": 1}) == {"echo": {"x": 1}}
    call_agent(agent.config.state_dir, "device.withhold", {"devices": [gpu_uuid(1)]})
    assert kubelet.wait_for(lambda: gpu_uuid(1) not in kubelet.healthy(RESOURCE_GPU))
    with pytest.raises(ControlError, match="unknown method"):
        call_agent(agent.config.state_dir, "no.such")
    with pytest.raises(ControlError, match="devices"):
        call_agent(agent.config.state_dir, "device.withhold", {"devices": "x"})


def _raw_exchange(path: Path, line: bytes, *, after_the_close: bool = False) -> dict[str, Any]:
    """Send ``line`` and read the answer. ``after_the_close``: send only once the agent has
    answered and closed its side (what a client that sends late meets when it is refused)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(10)
        conn.connect(str(path))
        if after_the_close:
            poller = select.poll()
            poller.register(conn, select.POLLIN | select.POLLHUP | select.POLLRDHUP)
            assert poller.poll(10_000), "the agent neither answered nor closed"
            deadline = time.monotonic() + 10
            while not any(event & (select.POLLHUP | select.POLLRDHUP) for _, event in poller.poll(100)):
                assert time.monotonic() < deadline, "the agent answered but kept the connection open"
        send_request(conn, line)
        answer = conn.makefile("rb").readline()
    decoded: dict[str, Any] = json.loads(answer)
    return decoded


def test_idle_control_clients_hold_no_worker_past_the_request_deadline(
    running: tuple[NodeAgent, KubeletEmulator, Holder],
) -> None:
    """More idle connections than workers, each sending nothing (or half a line): a real command
    still gets its answer, well before the 30 s an idle client could hold a worker."""
    agent, _, _ = running
    path = agent.config.state_dir / CONTROL_SOCKET
    idle = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(6)]
    try:
        for index, conn in enumerate(idle):
            conn.connect(str(path))
            if index % 2:
                conn.sendall(b'{"method": "agent.st')  # half a request line, never finished
        status = call_agent(agent.config.state_dir, "agent.status", timeout=3 * REQUEST_DEADLINE_S + 5)
        assert status["resources"][RESOURCE_GPU]["devices"] == 4
        late = idle[1].makefile("rb").readline()  # the half line is answered when its deadline passes
        assert json.loads(late)["code"] == "bad_request" and "request line" in json.loads(late)["error"]
    finally:
        for conn in idle:
            conn.close()


def test_connections_beyond_the_bound_are_answered_busy(
    running: tuple[NodeAgent, KubeletEmulator, Holder],
) -> None:
    """More idle connections than the control socket serves and queues: the next one gets the
    documented ``busy`` answer at once instead of waiting behind all of them."""
    agent, _, _ = running
    path = agent.config.state_dir / CONTROL_SOCKET
    idle = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(MAX_CONNECTIONS)]
    try:
        for conn in idle:
            conn.connect(str(path))
        answer = _raw_exchange(path, b'{"method": "agent.status"}\n')
        assert answer["ok"] is False and answer["code"] == "busy", answer
        assert str(MAX_CONNECTIONS) in answer["error"]
        # a client that sends only after the refusal closed the connection still reads why
        late = _raw_exchange(path, b'{"method": "agent.status"}\n', after_the_close=True)
        assert late["ok"] is False and late["code"] == "busy", late
        with pytest.raises(ControlError, match="already holds") as refused:
            call_agent(agent.config.state_dir, "agent.status", timeout=10)
        assert refused.value.code == "busy"
    finally:
        for conn in idle:
            conn.close()


@pytest.mark.parametrize("line", [b"\xff\xfe\n", b"[" * 100_000 + b"\n", b"null\n", b"\n", b"{}\n"])
def test_every_bad_request_line_gets_the_documented_answer(
    running: tuple[NodeAgent, KubeletEmulator, Holder], line: bytes
) -> None:
    agent, _, _ = running
    answer = _raw_exchange(agent.config.state_dir / CONTROL_SOCKET, line)
    assert answer["ok"] is False and answer["code"] == "bad_request" and answer["error"]
    assert call_agent(agent.config.state_dir, "agent.status")["resources"]  # still serving


def test_fractional_units_stay_on_one_gpu(dirs: tuple[Path, Path]) -> None:
    plan = SharingPlan(
        per_gpu={"2": GpuSharing(SharingMode.FRACTIONAL), "3": GpuSharing(SharingMode.FRACTIONAL)}
    )
    agent, kubelet = start(dirs, Holder(small_inventory()), plan)
    try:
        assert kubelet.wait_for(
            lambda: (
                len(kubelet.devices(RESOURCE_GPU_COMPUTE)) == 200
                and len(kubelet.devices(RESOURCE_GPU_MEMORY)) == 160
                and len(kubelet.devices(RESOURCE_GPU)) == 2
            )
        )
        first, response = kubelet.allocate(RESOURCE_GPU_COMPUTE, 70)
        gpu = first[0].split("::")[0]
        assert {i.split("::")[0] for i in first} == {gpu}
        assert response.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "70"
        second, _ = kubelet.allocate(RESOURCE_GPU_COMPUTE, 30)  # tightest fit: the 30 left on that GPU
        assert {i.split("::")[0] for i in second} == {gpu}
        _, memory = kubelet.allocate(RESOURCE_GPU_MEMORY, 10)
        assert memory.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10G"
        assert memory.envs["NVIDIA_VISIBLE_DEVICES"] == gpu  # beside the compute units just given
        other = ({gpu_uuid(2), gpu_uuid(3)} - {gpu}).pop()
        third, _ = kubelet.allocate(RESOURCE_GPU_COMPUTE, 50)  # does not fit the first GPU any more
        assert {i.split("::")[0] for i in third} == {other}
        _, memory = kubelet.allocate(RESOURCE_GPU_MEMORY, 5)  # tightest fit alone would pick the first
        assert memory.envs["NVIDIA_VISIBLE_DEVICES"] == other
        spread = [f"{gpu_uuid(2)}::compute-99", f"{gpu_uuid(3)}::compute-99"]
        with pytest.raises(grpc.RpcError, match="one GPU"):
            kubelet.stub(RESOURCE_GPU_COMPUTE).Allocate(
                api_pb2.AllocateRequest(
                    container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=spread)]
                )
            )
    finally:
        agent.stop()
        kubelet.stop()


def test_periodic_rediscovery_finds_hot_plugged_gpus_and_survives_failures(dirs: tuple[Path, Path]) -> None:
    kubelet_dir, state_dir = dirs
    kubelet = KubeletEmulator(kubelet_dir)
    kubelet.start()
    holder = FlakyHolder(small_inventory(gpus=2))
    config = AgentConfig(kubelet_dir=kubelet_dir, state_dir=state_dir, rediscover_interval=0.05)
    agent = device_plugin_agent(config, discover=holder.discover)
    agent.start()
    try:
        assert kubelet.wait_for(lambda: len(kubelet.devices(RESOURCE_GPU)) == 2)
        holder.failing = True
        holder.inventory = small_inventory(gpus=4)
        assert not kubelet.wait_for(lambda: len(kubelet.devices(RESOURCE_GPU)) != 2, timeout=0.5)
        holder.failing = False
        assert kubelet.wait_for(lambda: len(kubelet.devices(RESOURCE_GPU)) == 4)
        updates = kubelet.endpoint(RESOURCE_GPU).updates
        assert not kubelet.wait_for(lambda: kubelet.endpoint(RESOURCE_GPU).updates > updates, timeout=0.5)
    finally:
        agent.stop()
        kubelet.stop()
