"""Per-pod GPU use for the node agent (``nodeagent.usage_service``), started by the builder.

The processes come from the backend's NVML session through an ``NvmlCaller`` of their own (a read
stuck in the driver costs a deadline and holds up the next usage rounds only, never discovery's
calls), their cgroups from ``/proc`` (the host's: the DaemonSet runs with ``hostPID``; with a
simulated backend, the simulated host's ``proc/``), the pods from the agent's pod watch, the
limits from the kubelet's pod-resources API and, in DRA mode, the prepared claims' shares. With an
API server the rows are published for ``gpuweave status`` and over-limit pods are evicted.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from devicemodel.errors import GpuweaveError
from hardware.backend import GpuBackend
from hardware.gpu_processes import GpuProcessReader
from hardware.nvml import NvmlBackend
from hardware.nvml_call import NvmlCaller
from hardware.simulated.backend import SimulatedBackend
from hardware.simulated.node import SimulatedNode
from nodeagent.agent import NodeAgent
from nodeagent.metrics import AgentMetrics
from nodeagent.pod_usage import PodIdentities, ShareMemory
from nodeagent.podresources import PodResourcesClient
from nodeagent.usage_service import Evictor, PodUsageService, UsageSettings

if TYPE_CHECKING:  # the kubernetes client only with an API server
    from deviceplugin.kube import KubeParts

HOST_PROC = Path("/proc")
READ_TIMEOUT_S = 5.0


def add_usage_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--pod-usage-interval",
        type=float,
        default=UsageSettings.interval_s,
        help="seconds between reads of each pod's GPU use (processes, memory, SM utilisation), "
        "exported as gpuweave_pod_gpu_* metrics (0: off; docs/device-plugin.md)",
    )
    parser.add_argument(
        "--share-memory-grace",
        type=float,
        default=UsageSettings.memory_grace_s,
        help="seconds a container may hold more GPU memory than its share's limit before the agent "
        "evicts its pod (needs the API server and the pod-resources API)",
    )


def _caller_and_proc(backend: GpuBackend) -> tuple[NvmlCaller, Path]:
    """A caller of its own over the backend's NVML session: a process read stuck in the driver
    then holds up the next usage round only, not discovery's calls."""
    if isinstance(backend, SimulatedBackend):
        proc = SimulatedNode.proc_root(backend.sysfs_root)
        return NvmlCaller(backend.lib, timeout_s=READ_TIMEOUT_S), proc or HOST_PROC
    if isinstance(backend, NvmlBackend):
        return NvmlCaller(backend.lib, timeout_s=READ_TIMEOUT_S), HOST_PROC
    raise GpuweaveError(f"no GPU process reader for a {type(backend).__name__} backend")


def start_pod_usage(
    args: argparse.Namespace,
    *,
    agent: NodeAgent,
    backend: GpuBackend,
    metrics: AgentMetrics,
    kube: KubeParts | None,
    pod_resources: PodResourcesClient | None,
    share_memory: ShareMemory | None = None,
) -> Callable[[], None]:
    """Start the service (unless ``--pod-usage-interval 0``); returns what stops it."""
    if args.pod_usage_interval <= 0:
        return lambda: None
    caller, proc_root = _caller_and_proc(backend)
    evictor, publisher = _kube_side(kube, agent)
    service = PodUsageService(
        reader=GpuProcessReader(caller),
        proc_root=proc_root,
        node=lambda: (agent.inventory, agent.config.sharing),
        identities=kube.identities if kube is not None else PodIdentities(),
        containers=pod_resources.containers if pod_resources is not None else None,
        registry=metrics.registry,
        settings=UsageSettings(interval_s=args.pod_usage_interval, memory_grace_s=args.share_memory_grace),
        share_memory=share_memory,
        evictor=evictor,
    )
    if publisher is not None:
        publisher.attach(service)
    agent.control.add_route("usage.pods", lambda _params: service.status())
    service.start()

    def stop() -> None:
        service.stop()
        caller.close()

    return stop


class _Publishing:
    """Wires a ``UsagePublisher`` to the service once both exist."""

    def __init__(self, kube: KubeParts, node: str) -> None:
        self._kube = kube
        self._node = node

    def attach(self, service: PodUsageService) -> None:
        from nodeagent.usage_kube import UsagePublisher  # noqa: PLC0415 (kubernetes: with kube only)

        publisher = UsagePublisher(self._kube.api, node=self._node, rows=service.published)
        service.listeners.append(publisher.changed)


def _kube_side(kube: KubeParts | None, agent: NodeAgent) -> tuple[Evictor | None, _Publishing | None]:
    if kube is None:
        return None, None
    from health.kube import KubeCluster  # noqa: PLC0415
    from nodeagent.usage_kube import KubeEvictor  # noqa: PLC0415 (kubernetes: with kube only)

    node = agent.inventory.name
    return KubeEvictor(KubeCluster(kube.api, node_name=node)), _Publishing(kube, node)
