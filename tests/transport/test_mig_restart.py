"""A node agent restarted mid-reshape serves every GPU it knows at once and restores the other later.

Real parts: the node agent's gRPC servers on unix sockets, the kubelet emulator, the control
socket, the production MIG wiring (``build_mig_service``) and start-up order of
``gpuweave node-agent`` (``begin_restore`` before the first list, ``restore_in_background``
after). Life 1 dies (as ``kill -9`` would) right after creating a GPU instance for GPU 3 and
before its compute instance: the journal says a reshape is in flight, NVML holds half of it.
Life 2 starts on the same hardware and state directory; the test owns GPU 3 (as a long health
remediation or slow driver would) so its restore provably runs while the rest is served.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from devicemodel.contracts import RESOURCE_GPU, mig_resource_name
from deviceplugin.frontend import device_plugin_agent
from gpuweave.node.mig import build_mig_service, register_mig_routes
from hardware.profiles import load_profile
from hardware.simulated.backend import SimulatedBackend
from mig.planner import TargetEntry
from nodeagent.agent import AgentConfig
from nodeagent.control import call_agent
from tests.support.kubelet_emulator import KubeletEmulator
from tests.support.sim_mig import mig_reconciler

MIG_3G = mig_resource_name("3g.40gb")


class Killed(BaseException):
    """The process ends here (nothing after this point of the reshape runs)."""


def die_after_first_instance(point: str) -> None:
    if point.endswith(":create:gi-created"):
        raise Killed(point)


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gwr", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_restart_mid_reshape_serves_known_gpus_while_gpu_3_is_restored(root: Path) -> None:
    backend = SimulatedBackend(load_profile("dgx-h100"), root / "sysfs")
    backend.discover()  # initialises the NVML library, as the agent's start does
    kubelet = KubeletEmulator(root / "k")
    kubelet.start()
    try:
        first_life = mig_reconciler(
            backend.lib, backend.inventory, root / "s", fault=die_after_first_instance
        )
        with pytest.raises(Killed):
            first_life.apply(3, [TargetEntry("3g.40gb"), TargetEntry("3g.40gb")])
        assert first_life.journal.load().gpus[backend.inventory.gpu(3).uuid].in_flight

        agent = device_plugin_agent(
            AgentConfig(kubelet_dir=root / "k", state_dir=root / "s"), discover=backend.discover
        )
        mig = build_mig_service(agent, backend=backend, state_dir=root / "s", inventory=backend.discover())
        gpu3 = backend.inventory.gpu(3).uuid
        others = {g.uuid for g in backend.inventory.gpus} - {gpu3}
        with mig.reconciler.owners.hold(gpu3, who="test: GPU 3 is busy elsewhere"):
            assert mig.begin_restore() == [3]
            agent.start()
            mig.restore_in_background()
            register_mig_routes(agent, mig)
            assert kubelet.wait_for(lambda: kubelet.healthy(RESOURCE_GPU) == others, timeout=30)
            assert gpu3 not in kubelet.healthy(RESOURCE_GPU)  # its state is not known yet
            assert call_agent(root / "s", "mig.status")["restoring"] == [3]
        assert mig.restorer.join(30)
        assert kubelet.wait_for(lambda: len(kubelet.healthy(MIG_3G)) == 2, timeout=30)
        assert kubelet.healthy(RESOURCE_GPU) == others
        assert call_agent(root / "s", "mig.status")["gpus"]["3"] == [  # type: ignore[index]
            {"profile": "3g.40gb", "start": 0, "size": 4, "busy": False},
            {"profile": "3g.40gb", "start": 4, "size": 4, "busy": False},
        ]
        assert agent.health_report()["withheld"] == {}
        agent.stop()
    finally:
        kubelet.stop()
        backend.close()


def test_gpus_whose_journalled_layout_nvml_shows_are_not_withheld(root: Path) -> None:
    backend = SimulatedBackend(load_profile("dgx-h100"), root / "sysfs")
    backend.discover()
    try:
        first_life = mig_reconciler(backend.lib, backend.inventory, root / "s")
        first_life.apply(5, [TargetEntry("7g.80gb")])  # finished: the journal and NVML agree
        agent = device_plugin_agent(
            AgentConfig(kubelet_dir=root / "k", state_dir=root / "s"), discover=backend.discover
        )
        mig = build_mig_service(agent, backend=backend, state_dir=root / "s", inventory=backend.discover())
        assert mig.begin_restore() == []
        assert agent.health_report()["withheld"] == {}
    finally:
        backend.close()
