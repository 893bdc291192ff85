"""One MPS control daemon per fractional GPU, with the real node-agent process and the kubelet emulator.

GPUs 0 and 1 of a four-GPU node are fractional; their daemons are the simulated
``nvidia-cuda-mps-control`` run as processes (the same program path a GPU host runs), behind a
wrapper that refuses to start a daemon while a block file exists, so a test can keep one down.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from deviceplugin.control import call_agent
from hardware.mps import read_pid
from hardware.simulated import mps_control
from proto.v1beta1 import api_pb2
from tests.support.agent_node import AgentNode, run_sim_inject
from tests.support.agent_process import short_temp_dir
from tests.support.small_inventory import gpu_uuid, small_inventory
from topology.contracts import RESOURCE_GPU, RESOURCE_GPU_COMPUTE, RESOURCE_GPU_MEMORY
from topology.spec import NodeProfile

ROUND_S = 0.3
Listed = Callable[[dict[str, str]], bool]  # a test on one device list (ID -> health)
HEALTHY = "Healthy"


def _sharing(fractional: tuple[int, ...]) -> str:
    gpus = {
        str(i): {"mode": "fractional", "mps": {"defaultActiveThreadPercentage": 50 + i}} for i in fractional
    }
    return yaml.safe_dump({"kind": "SharingConfig", "gpus": gpus})


class Watch:
    """Our own ListAndWatch stream of one resource: every list the agent sends, in order."""

    def __init__(self, node: AgentNode, resource: str) -> None:
        self.lists: list[dict[str, str]] = []
        self._cond = threading.Condition()
        self._stream: Any = node.kubelet.stub(resource).ListAndWatch(api_pb2.Empty())
        self._thread = threading.Thread(target=self._consume, daemon=True)
        self._thread.start()

    def _consume(self) -> None:
        try:
            for response in self._stream:
                with self._cond:
                    self.lists.append({d.ID: d.health for d in response.devices})
                    self._cond.notify_all()
        except grpc.RpcError:
            pass

    def wait(self, predicate: Listed, *, start: int = 0, timeout: float = 20.0) -> int:
        """The index of the first list from ``start`` on that satisfies ``predicate``; -1 if none."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for index in range(start, len(self.lists)):
                    if predicate(self.lists[index]):
                        return index
                left = deadline - time.monotonic()
                if left <= 0:
                    return -1
                self._cond.wait(min(left, 0.1))

    def close(self) -> None:
        self._stream.cancel()
        self._thread.join(5)


class MpsNode(AgentNode):
    def __init__(self) -> None:
        root = short_temp_dir()
        profile = root / "node.yaml"
        profile.write_text(yaml.safe_dump(NodeProfile.from_inventory(small_inventory()).to_wire()))
        self.sharing = root / "sharing.yaml"
        self.sharing.write_text(_sharing((0, 1)))
        health = root / "health.yaml"
        health.write_text(yaml.safe_dump({"health": {"round_interval_s": ROUND_S, "startup_rounds": 1}}))
        self.block = root / "block-mps-start"
        wrapper = root / "mps-control"
        wrapper.write_text(
            "#!/bin/sh\n"
            f'if [ "$1" = "-d" ] && [ -e {self.block} ]; then echo "start blocked by test" >&2; exit 1; fi\n'
            f'exec {sys.executable} -I -S {mps_control.__file__} "$@"\n'
        )
        wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
        extra = ("--sharing-config", str(self.sharing), "--health-config", str(health))
        super().__init__(str(profile), extra=(*extra, "--mps-control", str(wrapper)), root=root)

    def pipe_dir(self, index: int) -> Path:
        return self.state_dir / "mps" / gpu_uuid(index) / "pipe"

    def mps_status(self) -> dict[str, dict[str, object]]:
        return dict(call_agent(self.state_dir, "mps.status", {})["gpus"])

    def share_ids(self, index: int, *, count: int, resource: str = RESOURCE_GPU_COMPUTE) -> list[str]:
        kind = "compute" if resource == RESOURCE_GPU_COMPUTE else "memory"
        return [f"{gpu_uuid(index)}::{kind}-{unit}" for unit in range(count)]

    def allocate(
        self, ids: list[str], resource: str = RESOURCE_GPU_COMPUTE
    ) -> api_pb2.ContainerAllocateResponse:
        request = api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)]
        )
        return self.kubelet.stub(resource).Allocate(request, timeout=10).container_responses[0]

    def kill_leftover_daemons(self) -> None:
        for pid_file in (self.state_dir / "mps").glob("*/pipe/" + mps_control.PID_FILE):
            pid = read_pid(pid_file.parent)
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def _all_healthy(gpu: int) -> Listed:
    prefix = gpu_uuid(gpu)
    return lambda devices: (
        any(i.startswith(prefix) for i in devices)
        and all(h == HEALTHY for i, h in devices.items() if i.startswith(prefix))
    )


def _none_healthy(gpu: int) -> Listed:
    prefix = gpu_uuid(gpu)
    return lambda devices: (
        any(i.startswith(prefix) for i in devices)
        and all(h != HEALTHY for i, h in devices.items() if i.startswith(prefix))
    )


@pytest.fixture
def node() -> Iterator[MpsNode]:
    started = MpsNode()
    try:
        assert started.kubelet.wait_for(
            lambda: (
                len(started.kubelet.healthy(RESOURCE_GPU_COMPUTE)) == 200
                and bool(started.kubelet.healthy(RESOURCE_GPU_MEMORY))
            ),
            timeout=30,
        ), started.kubelet.devices(RESOURCE_GPU_COMPUTE)
        yield started
    finally:
        started.kill_leftover_daemons()
        started.close()


def test_mps_two_fractional_gpus_run_two_daemons_and_allocate_gives_each_its_own_pipe(node: MpsNode) -> None:
    status = node.mps_status()
    assert sorted(status) == [gpu_uuid(0), gpu_uuid(1)]
    pids = {read_pid(node.pipe_dir(i)) for i in (0, 1)}
    assert None not in pids and len(pids) == 2
    for index in (0, 1):
        pipe = str(node.pipe_dir(index))
        compute = node.allocate(node.share_ids(index, count=30))
        assert compute.envs["CUDA_MPS_PIPE_DIRECTORY"] == pipe
        assert compute.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
        assert compute.envs["NVIDIA_VISIBLE_DEVICES"] == gpu_uuid(index)
        assert [(m.container_path, m.host_path) for m in compute.mounts] == [(pipe, pipe)]
        assert (node.pipe_dir(index) / mps_control.SOCKET_NAME).exists()
        memory = node.allocate(
            node.share_ids(index, count=4, resource=RESOURCE_GPU_MEMORY), RESOURCE_GPU_MEMORY
        )
        assert memory.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4G"
        assert memory.envs["CUDA_MPS_PIPE_DIRECTORY"] == pipe
        log = (node.pipe_dir(index).parent / "log" / mps_control.CONTROL_LOG).read_text()
        assert f"set_default_active_thread_percentage {50 + index}" in log


def test_mps_killed_daemon_withholds_only_its_gpu_then_the_restart_brings_it_back(node: MpsNode) -> None:
    watch = Watch(node, RESOURCE_GPU_COMPUTE)
    try:
        assert watch.wait(_all_healthy(0)) >= 0
        first = len(watch.lists)
        old_pid = read_pid(node.pipe_dir(0))
        done = run_sim_inject(node.state_dir, "--gpu", "0", "--kill-mps-daemon")
        assert done.returncode == 0, done.stderr
        withheld = watch.wait(_none_healthy(0), start=first)
        assert withheld >= 0, watch.lists[-1]
        assert _all_healthy(1)(watch.lists[withheld])
        back = watch.wait(_all_healthy(0), start=withheld)
        assert back > withheld
        assert all(_all_healthy(1)(devices) for devices in watch.lists[first:])
        assert read_pid(node.pipe_dir(0)) not in (None, old_pid)
        assert node.mps_status()[gpu_uuid(0)]["restarts"] == 1
    finally:
        watch.close()


def test_mps_share_is_never_granted_while_its_daemon_is_down(node: MpsNode) -> None:
    node.block.touch()
    assert run_sim_inject(node.state_dir, "--gpu", "0", "--kill-mps-daemon").returncode == 0
    with pytest.raises(grpc.RpcError) as refused:  # before any round noticed: Allocate queries it
        node.allocate(node.share_ids(0, count=10))
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "MPS" in str(refused.value.details())
    assert node.kubelet.wait_for(
        lambda: not node.kubelet.healthy(RESOURCE_GPU_COMPUTE) & set(node.share_ids(0, count=100))
    )
    assert node.allocate(node.share_ids(1, count=10)).envs["CUDA_MPS_PIPE_DIRECTORY"] == str(node.pipe_dir(1))

    def faulted() -> bool:
        gpus = call_agent(node.state_dir, "health.status", {})["gpus"]
        return gpus[gpu_uuid(0)]["state"] != HEALTHY and "MPS" in gpus[gpu_uuid(0)]["reason"]

    assert node.kubelet.wait_for(faulted, timeout=30)  # three failed starts: a fault of GPU 0 in health
    gpus = call_agent(node.state_dir, "health.status", {})["gpus"]
    assert {uuid for uuid, row in gpus.items() if row["state"] != HEALTHY} == {gpu_uuid(0)}
    with pytest.raises(grpc.RpcError):
        node.allocate(node.share_ids(0, count=10))
    node.block.unlink()
    assert node.kubelet.wait_for(lambda: bool(node.mps_status()[gpu_uuid(0)]["up"]), timeout=30)


def test_mps_switching_a_gpu_to_exclusive_stops_its_daemon(node: MpsNode) -> None:
    pipe = node.pipe_dir(1)
    assert read_pid(pipe) is not None
    node.sharing.write_text(_sharing((0,)))
    call_agent(node.state_dir, "sharing.reload", {})
    assert sorted(node.mps_status()) == [gpu_uuid(0)]
    assert read_pid(pipe) is None and not (pipe / mps_control.SOCKET_NAME).exists()
    assert node.kubelet.wait_for(lambda: f"{gpu_uuid(1)}" in "".join(node.kubelet.healthy(RESOURCE_GPU)))
    assert node.kubelet.wait_for(lambda: len(node.kubelet.devices(RESOURCE_GPU_COMPUTE)) == 100)
    assert read_pid(node.pipe_dir(0)) is not None
