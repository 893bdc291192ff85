"""The real node agents of the simulated cluster, one per node, each with its own kubelet.

Every node runs ``deviceplugin.agent.NodeAgent`` on its profile's inventory (simulated hardware)
with the node's sharing plan, serving its resources over gRPC on unix sockets in a temporary
directory; a ``SimKubelet`` registers them and watches their device lists. When the extender binds
a pod, the node's kubelet admits it (GetPreferredAllocation + Allocate with the devices the
extender chose), so a device the agent refuses shows up as an admission failure. A GPU fault is
set on the agent and the time until its kubelet sees the device Unhealthy is measured.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from deviceplugin.agent import AgentConfig, NodeAgent
from deviceplugin.sharing import GpuSharing, SharingMode, SharingPlan
from deviceplugin.topology_choice import gpu_chooser_for
from gpuweave.simulate.fleet import FleetNode
from gpuweave.simulate.kubelet import KubeletCallError, SimKubelet
from topology.contracts import RESOURCE_GPU
from topology.errors import GpuweaveError


class AgentStartError(GpuweaveError):
    """A node agent did not register its resources with its kubelet in time."""


@dataclass
class _Node:
    agent: NodeAgent
    kubelet: SimKubelet


class NodeAgentPool:
    def __init__(self, fleet: Sequence[FleetNode], *, share_nodes: frozenset[int]) -> None:
        self._fleet = tuple(fleet)
        self._root = Path(tempfile.mkdtemp(prefix="gws", dir="/tmp"))
        self._nodes: list[_Node] = []
        self.admitted = 0
        self.admission_failures: list[str] = []
        try:
            for index, node in enumerate(fleet):
                self._nodes.append(self._start(index, node, shared=index in share_nodes))
        except BaseException:
            self.close()
            raise

    def _start(self, index: int, node: FleetNode, *, shared: bool) -> _Node:
        kubelet_dir = self._root / f"n{index}" / "k"
        state_dir = self._root / f"n{index}" / "s"
        kubelet = SimKubelet(kubelet_dir)
        kubelet.start()
        mode = SharingMode.FRACTIONAL if shared else SharingMode.EXCLUSIVE
        config = AgentConfig(
            kubelet_dir=kubelet_dir, state_dir=state_dir, sharing=SharingPlan(default=GpuSharing(mode))
        )
        inventory = node.inventory
        agent = NodeAgent(config, discover=lambda: inventory, chooser_for=gpu_chooser_for)
        agent.start()
        expected = {RESOURCE_GPU} if not shared else set()
        if not kubelet.wait_for(expected | set(agent.resource_names()[:1])):
            agent.stop()
            kubelet.stop()
            raise AgentStartError(f"node agent of {node.name} did not register with its kubelet within 20 s")
        return _Node(agent, kubelet)

    def resources(self, node: int) -> dict[str, int]:
        return self._nodes[node].kubelet.resources()

    def admit(self, node: int, devices: Mapping[str, Sequence[str]]) -> bool:
        """The kubelet admits a pod's container with the devices the scheduler chose."""
        for resource, ids in devices.items():
            try:
                self._nodes[node].kubelet.admit(resource, list(ids))
            except KubeletCallError as exc:
                self.admission_failures.append(f"{self._fleet[node].name}: {exc}")
                return False
        self.admitted += 1
        return True

    def gpu_failed(self, node: int, gpu: int, reason: str) -> float | None:
        """Mark the GPU unhealthy on its agent; seconds until the kubelet sees it (None: never)."""
        uuid = self._fleet[node].inventory.gpus[gpu].uuid
        started = time.monotonic()
        self._nodes[node].agent.set_device_health(uuid, False, reason)
        return self._nodes[node].kubelet.wait_unhealthy(uuid, since=started)

    def gpu_restored(self, node: int, gpu: int) -> None:
        uuid = self._fleet[node].inventory.gpus[gpu].uuid
        self._nodes[node].agent.set_device_health(uuid, True)

    def close(self) -> None:
        for node in self._nodes:
            node.agent.stop()
            node.kubelet.stop()
        self._nodes = []
        shutil.rmtree(self._root, ignore_errors=True)
