"""MIG and health never undo each other: a fault on a GPU mid-reshape waits for the reshape, alone.

Real parts: the node agent's gRPC servers and the kubelet emulator, the MIG service and health as
``gpuweave node-agent`` wires them (``build_mig_service``, ``start_node_health`` with
``mig_recreator`` and the reconciler's ``GpuOwners``), the simulated driver raising the Xid.
MIG calls take 0.05 s each (the simulated driver's latency knob), so the operator's reshape of
GPU 3 is in flight for about 7 s, three times the watchdog's stall threshold (2.15 s here), when
the Xid arrives.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from devicemodel.contracts import RESOURCE_GPU, mig_resource_name
from deviceplugin.frontend import device_plugin_agent
from gpuweave.node.health import mig_recreator, start_node_health
from gpuweave.node.mig import build_mig_service
from hardware.profiles import load_profile
from hardware.simulated.backend import SimulatedBackend
from health.config import HealthSettings
from mig.planner import TargetEntry
from nodeagent.agent import AgentConfig
from tests.support.kubelet_emulator import KubeletEmulator
from tests.support.waiting import poll_until

SETTINGS = HealthSettings(round_interval_s=0.05, check_timeout_s=1.0, event_wait_ms=20)  # stalls after 2.15 s


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gwo", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def watchdog_faults(health: object) -> float:
    registry = health.metrics.registry  # type: ignore[attr-defined]
    return sum(
        sample.value
        for metric in registry.collect()
        for sample in metric.samples
        if sample.name == "gpuweave_health_faults_total" and sample.labels.get("signal") == "watchdog"
    )


def test_xid_48_on_an_instance_a_reshape_destroys_waits_and_reverts_nothing(root: Path) -> None:
    state = root / "s"
    backend = SimulatedBackend(load_profile("dgx-h100"), root / "sysfs", kmsg_path=state / "kmsg")
    kubelet = KubeletEmulator(root / "k")
    kubelet.start()
    agent = device_plugin_agent(
        AgentConfig(kubelet_dir=root / "k", state_dir=state), discover=backend.discover
    )
    mig = build_mig_service(agent, backend=backend, state_dir=state, inventory=backend.discover())
    mig.begin_restore()
    agent.start()
    mig.restore_in_background()
    before = mig.reconciler.apply(3, [TargetEntry("3g.40gb"), TargetEntry("3g.40gb")])
    health = start_node_health(
        agent,
        backend=backend,
        state_dir=state,
        node_name="node-a",
        settings=SETTINGS,
        recreate_mig=mig_recreator(mig, agent),
        gpu_owners=mig.reconciler.owners,
    )
    gpu3 = backend.inventory.gpu(3).uuid
    others = {g.uuid for g in backend.inventory.gpus} - {gpu3}
    try:
        assert kubelet.wait_for(lambda: kubelet.healthy(RESOURCE_GPU) == others, timeout=30)
        assert poll_until(lambda: not health.snapshot().startup_pending, timeout=30)
        backend.lib.mig_latency_s = 0.05
        operator = threading.Thread(target=lambda: mig.reconciler.apply(3, [TargetEntry("7g.80gb")]))
        operator.start()
        assert poll_until(lambda: mig.reconciler.owners.holder(gpu3) == "MIG reshape", timeout=10, every=0.01)
        victim = before.created[0]
        gi = next(m.gpu_instance_id for m in agent.inventory.mig_devices if m.uuid == victim.mig_uuid)
        backend.node.health.inject_xid(3, 48, gpu_instance=gi, compute_instance=0)
        while operator.is_alive():  # the reshape runs for seconds; every other GPU stays served
            assert kubelet.healthy(RESOURCE_GPU) == others
            assert backend.node.health.gpus[3].resets == 0  # no GPU reset inside the reshape
            operator.join(0.1)
        backend.lib.mig_latency_s = 0.0
        assert poll_until(
            lambda: backend.node.health.gpus[3].resets == 1, timeout=30
        )  # the DBE's reset, after
        assert poll_until(lambda: not health.remediator._jobs, timeout=30)
        assert kubelet.wait_for(lambda: len(kubelet.healthy(mig_resource_name("7g.80gb"))) == 1, timeout=30)
        assert [(i.profile, i.start) for i in mig.reconciler.current(3)] == [("7g.80gb", 0)]  # not reverted
        assert kubelet.healthy(mig_resource_name("3g.40gb")) == set()
        assert watchdog_faults(health) == 0
    finally:
        health.stop()
        agent.stop()
        kubelet.stop()
        backend.close()
