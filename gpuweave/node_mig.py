"""Wire the MIG manager into a started-or-starting node agent (part of the node-agent composition root).

It builds the NVML MIG adapter on the backend's own library and per-call timeout wrapper, the
journal in STATE_DIR, the reconciler with hooks into the agent (withhold devices before they are
destroyed, refresh lists in place after), converges whatever the journal says was in flight or
was lost to a reboot, and registers the ``mig.apply``, ``mig.plan`` and ``mig.status`` commands
on the agent's control socket.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client as kube_client
from kubernetes.client.exceptions import ApiException

from deviceplugin.agent import NodeAgent
from hardware.backend import GpuBackend
from hardware.mig_ops import GpuResetter, MigOps, NvidiaSmiResetter
from hardware.nvml import NvmlBackend
from hardware.simulated.backend import SimulatedBackend
from mig.catalog import default_catalog
from mig.journal import MigJournal
from mig.reconciler import GpuRef, MigReconciler
from mig.service import AgentHooks, LayoutFollower, MigService
from topology.contracts import MIG_LAYOUT_ANNOTATION
from topology.errors import GpuweaveError
from topology.inventory import NodeInventory


def build_mig_service(
    agent: NodeAgent, *, backend: GpuBackend, state_dir: Path, inventory: NodeInventory
) -> MigService:
    """The MIG service for this node; call ``start()`` on it, then ``register_mig_routes``."""
    nvml, resetter = _nvml_of(backend)
    hooks = AgentHooks(agent)
    reconciler = MigReconciler(
        ops=MigOps(nvml.lib, call=nvml.caller, resetter=resetter),
        journal=MigJournal(state_dir),
        catalog=default_catalog(),
        gpus=[GpuRef(g.index, g.uuid, g.product) for g in inventory.gpus],
        hooks=hooks,
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


def node_annotation_reader(api: Any, node_name: str) -> Callable[[], str | None]:
    """Reads this node's ``gpuweave.io/mig-layout`` annotation through the API server."""
    core = kube_client.CoreV1Api(api)

    def read() -> str | None:
        try:
            metadata = core.read_node(node_name).metadata
        except ApiException as exc:
            if exc.status == 404:  # no Node object (yet): nothing declared
                return None
            raise
        annotations = (metadata.annotations if metadata is not None else None) or {}
        value = annotations.get(MIG_LAYOUT_ANNOTATION)
        return str(value) if value is not None else None

    return read


def follow_layout_annotation(api: Any, node_name: str, service: MigService) -> LayoutFollower:
    """Start applying the node's declared MIG layout as it changes; stop it before the agent."""
    follower = LayoutFollower(node_annotation_reader(api, node_name), service)
    follower.start()
    return follower
