"""Wire the MIG manager into a started-or-starting node agent (part of the node-agent composition root).

It builds the NVML MIG adapter on the backend's own library and per-call timeout wrapper, the
journal in STATE_DIR, the reconciler with hooks into the agent (withhold devices before they are
destroyed, refresh lists in place after), converges whatever the journal says was in flight or
was lost to a reboot, and registers the ``mig.apply``, ``mig.plan`` and ``mig.status`` commands
on the agent's control socket. With an API server it watches this node's Node object (the declared
layout annotation, and the labels demand mode matches node selectors against) and, in demand
mode, the pending pods (``gpuweave/node_mig_demand.py``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from deviceplugin.agent import NodeAgent
from deviceplugin.listwatch import WATCH_TIMEOUT_S, ListWatch
from deviceplugin.podresources import HeldDevices, PodResourcesClient
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

LOG = logging.getLogger(__name__)
FALLBACK_POLL_S = 60.0  # the annotation is still read this often, in case the watch missed a change


def build_mig_service(
    agent: NodeAgent,
    *,
    backend: GpuBackend,
    state_dir: Path,
    inventory: NodeInventory,
    pod_resources: PodResourcesClient | None = None,
) -> MigService:
    """The MIG service for this node; call ``start()`` on it, then ``register_mig_routes``.

    A device counts as busy (kept by every reshape) when NVML sees a process on it, when the
    kubelet's pod-resources API lists it as allocated (``pod_resources``; a pod whose container has
    not started holds it too), or when this agent granted it in Allocate seconds ago. An
    unreachable pod-resources API makes every reshape fail closed (``MigBusyUnknownError``)."""
    nvml, resetter = _nvml_of(backend)
    hooks = AgentHooks(agent, held_by_pods=HeldDevices(pod_resources, agent.allocations))
    reconciler = MigReconciler(
        ops=MigOps(nvml.lib, call=nvml.caller, resetter=resetter),
        journal=MigJournal(state_dir),
        catalog=default_catalog(),
        gpus=[GpuRef(g.index, g.uuid, g.product, g.pci_bus_id) for g in inventory.gpus],
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
    # The kubernetes client is imported only with an API server: --no-kube agents stay small.
    from kubernetes import client as kube_client  # noqa: PLC0415
    from kubernetes.client.exceptions import ApiException  # noqa: PLC0415

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
    """Start applying the node's declared MIG layout as it changes (polled); stop it before the agent."""
    follower = LayoutFollower(node_annotation_reader(api, node_name), service)
    follower.start()
    return follower


class NodeWatch:
    """Watches this node's Node object (field selector metadata.name) for its labels and the
    declared layout; new layout values go straight to the follower, label changes to ``on_labels``."""

    def __init__(
        self,
        api: Any,
        node_name: str,
        *,
        follower: LayoutFollower,
        on_labels: Callable[[], None] = lambda: None,
        timeout_s: int = WATCH_TIMEOUT_S,
    ) -> None:
        from kubernetes import client as kube_client  # noqa: PLC0415 (only with an API server)

        self._core = kube_client.CoreV1Api(api)
        self._node = node_name
        self._follower = follower
        self._on_labels = on_labels
        self._timeout_s = timeout_s
        self._labels: dict[str, str] = {}
        self._lock = threading.Lock()
        self._watch = ListWatch(
            self._core.list_node,
            on_list=self._seen_all,
            on_event=lambda kind, node: self._seen(node) if kind in ("ADDED", "MODIFIED") else None,
            what=f"node {node_name}",
            timeout_s=timeout_s,
            field_selector=f"metadata.name={node_name}",
        )
        self._thread = threading.Thread(target=self._watch.run, name="mig-node-watch", daemon=True)

    def labels(self) -> dict[str, str]:
        with self._lock:
            return dict(self._labels)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._watch.stop()
        if self._thread.is_alive():
            self._thread.join(timeout=self._timeout_s + 10)

    def _seen_all(self, nodes: Sequence[Any]) -> None:
        for node in nodes:
            self._seen(node)

    def _seen(self, node: Any) -> None:
        metadata = node.metadata
        if metadata is None or metadata.name != self._node:
            return
        labels = dict(metadata.labels or {})
        with self._lock:
            changed, self._labels = labels != self._labels, labels
        value = (metadata.annotations or {}).get(MIG_LAYOUT_ANNOTATION)
        self._follower.offer(str(value) if value is not None else None)
        if changed:
            self._on_labels()


class MigKube:
    """The API-server side of the MIG manager: layout follower + Node watch (+ demand mode)."""

    def __init__(self, follower: LayoutFollower, node_watch: NodeWatch, demand: Any | None = None) -> None:
        self.follower = follower
        self.node_watch = node_watch
        self.demand = demand

    def stop(self) -> None:
        if self.demand is not None:
            self.demand.stop()
        self.node_watch.stop()
        self.follower.stop()


def start_mig_kube(
    api: Any,
    node_name: str,
    service: MigService,
    *,
    demand: bool = False,
    timeout_s: int = WATCH_TIMEOUT_S,
    fallback_poll_s: float = FALLBACK_POLL_S,
) -> MigKube:
    """Follow the declared layout through a Node watch (a read every ``fallback_poll_s`` as a
    fallback) and, with ``demand``, serve pending pods' MIG requests; stop it before the agent."""
    follower = LayoutFollower(node_annotation_reader(api, node_name), service, interval_s=fallback_poll_s)
    driver = None
    if demand:
        from gpuweave.node_mig_demand import DemandDriver  # noqa: PLC0415 (imports this module)

        driver = DemandDriver(api, node_name, service, timeout_s=timeout_s)
    node_watch = NodeWatch(
        api,
        node_name,
        follower=follower,
        on_labels=driver.wake if driver is not None else lambda: None,
        timeout_s=timeout_s,
    )
    follower.start()
    node_watch.start()
    if driver is not None:
        driver.start(labels=node_watch.labels)
    return MigKube(follower, node_watch, driver)
