"""Wire the MIG manager into a started-or-starting node agent (used by ``gpuweave.node.builder``).

It builds the NVML MIG adapter on the backend's own library and per-call timeout wrapper, the
journal in STATE_DIR, the reconciler with hooks into the agent (withhold devices before they are
destroyed, refresh lists in place after), converges whatever the journal says was in flight or
was lost to a reboot, and registers the ``mig.apply``, ``mig.plan`` and ``mig.status`` commands
on the agent's control socket. It lives here, not in ``mig/``, because it joins the MIG manager to
the device plugin's agent; the Kubernetes side (the Node watch for the declared layout, and demand
mode's pending pods) needs nothing of the agent and is ``mig/kube.py`` and ``mig/kube_demand.py``.
"""

from __future__ import annotations

from pathlib import Path

from devicemodel.errors import GpuweaveError
from devicemodel.inventory import NodeInventory
from hardware.backend import GpuBackend
from hardware.mig_catalog import default_catalog
from hardware.mig_ops import GpuResetter, MigOps, NvidiaSmiResetter
from hardware.nvml import NvmlBackend
from hardware.simulated.backend import SimulatedBackend
from mig.journal import MigJournal
from mig.metrics import MigMetrics
from mig.reconciler import GpuRef, MigReconciler
from mig.service import AgentHooks, HeldByPods, MigService
from nodeagent.agent import NodeAgent
from nodeagent.podresources import HeldDevices, PodResourcesClient


def build_mig_service(
    agent: NodeAgent,
    *,
    backend: GpuBackend,
    state_dir: Path,
    inventory: NodeInventory,
    pod_resources: PodResourcesClient | None = None,
    held_by_pods: HeldByPods | None = None,
) -> MigService:
    """The MIG service for this node; call ``start()`` on it, then ``register_mig_routes``.

    A device counts as busy (kept by every reshape) when NVML sees a process on it, when the
    kubelet's pod-resources API lists it as allocated (``pod_resources``; a pod whose container has
    not started holds it too), or when this agent granted it in Allocate seconds ago. An
    unreachable pod-resources API makes every reshape fail closed (``MigBusyUnknownError``).
    ``held_by_pods`` replaces those two sources (the simulated cluster's own record of the devices
    its pods hold, standing in for the kubelet's API)."""
    nvml, resetter = _nvml_of(backend)
    held = held_by_pods if held_by_pods is not None else HeldDevices(pod_resources, agent.allocations)
    hooks = AgentHooks(agent, held_by_pods=held)
    reconciler = MigReconciler(
        ops=MigOps(nvml.lib, call=nvml.caller, resetter=resetter),
        journal=MigJournal(state_dir),
        catalog=default_catalog(),
        gpus=[GpuRef(g.index, g.uuid, g.product, g.pci_bus_id) for g in inventory.gpus],
        hooks=hooks,
        metrics=MigMetrics(agent.metrics.registry),  # served on the agent's /metrics
    )
    return MigService(reconciler, hooks=hooks)


def register_mig_routes(agent: NodeAgent, service: MigService) -> None:
    for method, handler in service.routes().items():
        agent.control.add_route(method, handler)


def _nvml_of(backend: GpuBackend) -> tuple[NvmlBackend, GpuResetter]:
    if isinstance(backend, SimulatedBackend):
        return backend.nvml, backend.node.mig
    if isinstance(backend, NvmlBackend):
        return backend, NvidiaSmiResetter()
    raise GpuweaveError(f"the MIG manager needs an NVML backend, not {type(backend).__name__}")
