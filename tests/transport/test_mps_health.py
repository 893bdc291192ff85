"""A GPU whose MPS daemon cannot be restarted is a fault of that GPU in health, graded and remediated.

Real parts, wired as ``gpuweave node-agent`` wires them: the agent's gRPC servers and the kubelet
emulator, ``start_node_mps`` with the simulated control program run as processes (behind a
wrapper that can refuse starts), ``start_node_health`` with ``MpsSignal`` over the simulated
driver. Short rounds; MPS restarts retried after 0.05 s, 0.1 s, ... (pytest -k mps).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from devicemodel.contracts import RESOURCE_GPU_COMPUTE
from devicemodel.sharing import GpuSharing, SharingMode, SharingPlan
from devicemodel.spec import NodeProfile
from deviceplugin.frontend import device_plugin_agent
from gpuweave.node.health import start_node_health
from gpuweave.node.mps import MPS_SIGNAL, MpsSignal, start_node_mps
from hardware.mps_process import ProcessMpsDaemons
from hardware.simulated.backend import SimulatedBackend
from health.config import HealthSettings
from health.policy import DeviceState
from health.service import HealthService
from nodeagent.agent import AgentConfig
from nodeagent.mps import MpsSettings
from tests.support.kubelet_emulator import KubeletEmulator
from tests.support.mps_node import blockable_control
from tests.support.small_inventory import gpu_uuid, small_inventory
from tests.support.waiting import poll_until

SETTINGS = HealthSettings(round_interval_s=0.1, check_timeout_s=2.0, event_wait_ms=20, startup_rounds=1)


def samples(health: HealthService, name: str, **labels: str) -> float:
    return sum(
        sample.value
        for metric in health.metrics.registry.collect()
        for sample in metric.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gwm", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_mps_daemon_that_cannot_restart_is_a_gpu_fault_remediated_alone(root: Path) -> None:
    state = root / "s"
    backend = SimulatedBackend(
        NodeProfile.from_inventory(small_inventory()), root / "sysfs", kmsg_path=state / "kmsg"
    )
    kubelet = KubeletEmulator(root / "k")
    kubelet.start()
    fractional = GpuSharing(SharingMode.FRACTIONAL)
    plan = SharingPlan(per_gpu={"0": fractional, "1": fractional})
    agent = device_plugin_agent(
        AgentConfig(kubelet_dir=root / "k", state_dir=state, sharing=plan), discover=backend.discover
    )
    program, block = blockable_control(root)
    mps = start_node_mps(
        agent,
        daemons=ProcessMpsDaemons([str(program)]),
        inventory=backend.discover(),
        settings=MpsSettings(base_dir=state / "mps", restart_base_s=0.05, restart_cap_s=0.2),
    )
    agent.start()
    health = start_node_health(
        agent,
        backend=backend,
        state_dir=state,
        node_name="node-a",
        settings=SETTINGS,
        signals=(MpsSignal(mps),),
        kill_mps=mps.kill,
    )
    try:
        assert kubelet.wait_for(lambda: len(kubelet.healthy(RESOURCE_GPU_COMPUTE)) == 200, timeout=30)
        block.touch()
        mps.kill(0)
        assert poll_until(
            lambda: samples(health, "gpuweave_health_faults_total", signal=MPS_SIGNAL) == 1, timeout=30
        )
        record = health.snapshot().gpus[gpu_uuid(0)]
        # Remediating ("reset-gpu: MPS ...") or, once the reset ran, Probation ("probation after
        # reset-gpu: MPS ..."): the reason names the MPS fault in both
        assert record.state is not DeviceState.HEALTHY
        assert "MPS control daemon cannot be restarted" in record.reason, record.reason
        assert record.cause is not None and record.cause.value == "driver"
        assert all(health.snapshot().gpus[gpu_uuid(i)].state is DeviceState.HEALTHY for i in (1, 2, 3))
        rounds = health.monitor.rounds_completed
        assert poll_until(lambda: health.monitor.rounds_completed >= rounds + 5, timeout=30)
        assert samples(health, "gpuweave_health_faults_total", signal=MPS_SIGNAL) == 1  # once, not per round
        assert poll_until(
            lambda: samples(health, "gpuweave_health_remediations_total", action="reset-gpu") >= 1, timeout=30
        )
        block.unlink()
        assert poll_until(
            lambda: health.snapshot().gpus[gpu_uuid(0)].state is DeviceState.HEALTHY, timeout=30
        )
        assert kubelet.wait_for(lambda: len(kubelet.healthy(RESOURCE_GPU_COMPUTE)) == 200, timeout=30)
    finally:
        health.stop()
        mps.stop()
        agent.stop()
        kubelet.stop()
        backend.close()
