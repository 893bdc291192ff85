"""The node agent's one builder: a hardware backend and an ``AgentConfig`` in, the agent and its parts out.

``NodeAgentBuilder`` constructs the agent and its parts the same way for ``gpuweave node-agent``
(``gpuweave.commands.node_agent``) and for every node of the simulated cluster
(``gpuweave.simulate.agents``):

- ``agent``: the ``NodeAgent`` from an ``AgentConfig``, discovering through the backend, choosing
  GPU sets with the topology chooser (``gpu_chooser_for``) and counting into the builder's
  ``AgentMetrics`` (one registry per node agent; MIG and health register their metrics there too);
- ``mps``: one MPS control daemon per fractional GPU (``gpuweave.node.mps``), started before the
  agent serves, its pipes under ``STATE_DIR/mps`` on a simulated backend;
- ``mig``: the MIG manager (``gpuweave.node.mig.build_mig_service``: GPUs with their PCI bus IDs,
  the journal in ``STATE_DIR``, metrics on the agent's registry);
- ``health``: the health service (``gpuweave.node.health``) with the MPS supervisor in every round
  and, given the MIG service, MIG device recreation and GPU ownership during resets;
- ``fabric``: the NVSwitch fabric gate (``gpuweave.node.fabric``).

For the node-agent process it adds ``open_backend`` (the node's GPUs through NVML and sysfs, or a
simulated node profile) and ``start_parts``: MIG restore, the fabric gate, the agent's servers,
health, the API-server watches and publishing, DRA, per-pod GPU use (``gpuweave.node.usage``)
and ``/metrics``, started in that order and stopped in reverse. Flag parsing, signals and
opening the API-server and kubelet connections stay in the command.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from devicemodel.errors import GpuweaveError
from devicemodel.inventory import NodeInventory
from deviceplugin.frontend import DevicePluginFrontEnd, HandoffSource
from deviceplugin.topology_choice import gpu_chooser_for
from gpuweave.node.dra import NodeDra, NodeDraStarter
from gpuweave.node.fabric import fabric_gate
from gpuweave.node.health import SIM_KMSG_FILE, mig_recreator, start_node_health
from gpuweave.node.imex import ImexConfigWriter, ImexMetrics, ImexReconciler, ImexSource
from gpuweave.node.mig import build_mig_service, register_mig_routes
from gpuweave.node.mps import MpsSignal, NodeMps, mps_base_dir, start_node_mps
from gpuweave.node.usage import start_pod_usage
from hardware.backend import GpuBackend
from hardware.gpu_identity import IDENTITY_FILE
from hardware.host_check import run_self_check
from hardware.mps import MpsDaemons
from hardware.nvml import NvmlBackend
from hardware.profiles import load_profile
from hardware.simulated.backend import SimulatedBackend
from health.config import HealthSettings
from health.engine import Clock
from health.service import HealthService
from health.signals.fabric import FabricGate
from mig.service import HeldByPods, MigService
from nodeagent.agent import AgentConfig, NodeAgent
from nodeagent.cdi import CdiPublisher
from nodeagent.metrics import AgentMetrics, serve_metrics
from nodeagent.mps import MpsSettings
from nodeagent.podresources import HeldDevices, PodResourcesClient

if TYPE_CHECKING:
    from deviceplugin.kube import KubeParts
    from mig.kube import MigKube

log = logging.getLogger(__name__)
SIM_EXERCISER_FAULTS_FILE = "sim-exerciser-faults.json"  # a simulated node's bad cells and slow links


def open_backend(simulate: str | None, *, node_name: str, state_dir: Path) -> GpuBackend:
    """The hardware source: the node's GPUs through NVML and sysfs, or (``simulate``: a profile
    name or file) a simulated node profile read by the same NVML/sysfs code."""
    state_dir.mkdir(parents=True, exist_ok=True)
    identities = state_dir / IDENTITY_FILE  # names a GPU that stops answering, across restarts
    if simulate:
        return SimulatedBackend(
            load_profile(simulate),
            node_name=node_name,
            kmsg_path=state_dir / SIM_KMSG_FILE,
            identity_file=identities,
            exerciser_faults=state_dir / SIM_EXERCISER_FAULTS_FILE,
        )
    check = run_self_check()  # before the driver: name every missing prerequisite in one line
    if check.fatal:
        raise GpuweaveError(check.line())
    if check.missing:
        log.warning("%s", check.line())
    return NvmlBackend(node_name=node_name, identity_file=identities)


@dataclass
class StartedParts:
    """What ``NodeAgentBuilder.start_parts`` started, stopped in the reverse order."""

    stoppers: list[Callable[[], None]] = field(default_factory=list)

    def stop(self) -> None:
        for stopper in reversed(self.stoppers):
            stopper()


@dataclass
class NodeAgentBuilder:
    """Builds one node's agent and its parts over ``backend``; ``state_dir`` is the agent's
    (``AgentConfig.state_dir``), ``node_name`` its Node's."""

    backend: GpuBackend
    state_dir: Path
    node_name: str
    metrics: AgentMetrics = field(default_factory=AgentMetrics)  # its own registry unless given one

    @property
    def simulated(self) -> bool:
        return isinstance(self.backend, SimulatedBackend)

    def agent(
        self, config: AgentConfig, *, handoff: HandoffSource | None = None, cdi: CdiPublisher | None = None
    ) -> NodeAgent:
        """The agent, not started: ``mps`` (and, in the process, ``start_parts``) come next. Its
        device-plugin front end is attached unless ``config.serve_device_plugins`` is False (DRA
        mode: ``gpuweave.node.dra.NodeDraStarter`` serves the devices)."""
        agent = NodeAgent(config, discover=self.backend.discover, metrics=self.metrics, cdi=cdi)
        if config.serve_device_plugins:
            agent.attach(DevicePluginFrontEnd(agent, chooser_for=gpu_chooser_for, handoff=handoff))
        return agent

    def mps(
        self,
        agent: NodeAgent,
        *,
        daemons: MpsDaemons,
        inventory: NodeInventory,
        sharing_config: Path | None = None,
    ) -> NodeMps:
        """One MPS control daemon per fractional GPU, started before the first device list (a GPU
        without a live daemon is withheld from it); ``sharing_config`` adds ``sharing.reload``."""
        base_dir = mps_base_dir(agent.config.sharing, state_dir=self.state_dir, simulated=self.simulated)
        return start_node_mps(
            agent,
            daemons=daemons,
            inventory=inventory,
            settings=MpsSettings(base_dir=base_dir),
            sharing_config=sharing_config,
        )

    def mig(
        self,
        agent: NodeAgent,
        *,
        inventory: NodeInventory,
        pod_resources: PodResourcesClient | None = None,
        held_by_pods: HeldByPods | None = None,
    ) -> MigService:
        """The MIG service, not started (``begin_restore`` and ``restore_in_background`` around
        ``agent.start``, or ``start``). Busy devices come from ``pod_resources`` and the agent's
        recent grants, or from ``held_by_pods`` instead (``build_mig_service``)."""
        return build_mig_service(
            agent,
            backend=self.backend,
            state_dir=self.state_dir,
            inventory=inventory,
            pod_resources=pod_resources,
            held_by_pods=held_by_pods,
        )

    def health(
        self,
        agent: NodeAgent,
        *,
        settings: HealthSettings,
        mps: NodeMps,
        mig: MigService | None = None,
        kube_api: Any | None = None,
        pod_resources: PodResourcesClient | None = None,
        taints_evict: bool = False,
        clock: Clock = time.monotonic,
        held_by_pods: HeldByPods | None = None,
    ) -> HealthService:
        """Health for a started agent, started; stop it before the agent. With ``mig`` a failed MIG
        device is recreated through the MIG manager and a GPU reset never runs inside a reshape;
        ``clock`` times health (the simulation's agents run on its simulated clock).
        ``held_by_pods``: the devices pods hold (default: the kubelet's pod-resources API and the
        agent's recent grants); the simulation's kubelet gives its own."""
        return start_node_health(
            agent,
            backend=self.backend,
            state_dir=self.state_dir,
            node_name=self.node_name,
            settings=settings,
            kube_api=kube_api,
            metrics=self.metrics,
            recreate_mig=mig_recreator(mig, agent) if mig is not None else None,
            gpu_owners=mig.reconciler.owners if mig is not None else None,
            pod_devices=pod_resources.pod_devices if pod_resources is not None else None,
            signals=(MpsSignal(mps),),
            kill_mps=mps.kill,
            taints_evict=taints_evict,
            held_by_pods=held_by_pods or HeldDevices(pod_resources, agent.allocations),
            pods_known=pod_resources is not None,
            clock=clock,
        )

    def fabric(self, agent: NodeAgent, *, interval_s: float) -> FabricGate:
        """The NVSwitch fabric gate; ``check(inventory)`` before the agent starts, then ``start``."""
        return fabric_gate(agent, self.backend, interval_s=interval_s)

    def start_parts(
        self,
        args: argparse.Namespace,
        *,
        agent: NodeAgent,
        kube: KubeParts | None,
        mps: NodeMps,
        inventory: NodeInventory,
        pod_resources: PodResourcesClient | None,
        health_settings: HealthSettings,
        mig_mode: str,
    ) -> StartedParts:
        """The node-agent process's start: MIG, fabric gate, the agent's servers, health,
        publishing, DRA and metrics, in that order (``mig_mode``: off, declared or demand)."""
        started = StartedParts()
        mig = self.mig(agent, inventory=inventory, pod_resources=pod_resources)
        mig.begin_restore()  # GPUs whose journalled layout NVML does not show: withheld from the first list
        fabric = self.fabric(agent, interval_s=args.fabric_check_interval)
        fabric.check(inventory)  # GPUs on an untrained NVSwitch fabric are withheld from the first list
        agent.start()
        mig.restore_in_background()  # the other GPUs serve while those are restored, one by one
        fabric.start(lambda: agent.inventory)
        started.stoppers.append(fabric.stop)
        register_mig_routes(agent, mig)
        if kube is not None and mig_mode != "off":
            started.stoppers.append(
                _open_mig_kube(kube, self.node_name, mig, demand=mig_mode == "demand").stop
            )
        health = self.health(
            agent,
            settings=health_settings,
            mps=mps,
            mig=mig,
            kube_api=kube.api if kube else None,
            pod_resources=pod_resources,
            taints_evict=bool(args.dra),  # DRA: NoExecute device taints, evicted by kube-controller-manager
        )
        started.stoppers.append(health.stop)
        if kube is not None:
            kube.start(
                agent,
                kubelet_devices=pod_resources.list_devices if pod_resources is not None else None,
                correct_assignments=args.correct_assignments,
            )
            if not args.dra:  # DRA mode: the IMEX domain follows claims (``_start_dra``)
                started.stoppers.append(self.imex(kube, agent, config_dir=args.imex_config_dir))
        stop_dra, dra = self._start_dra(
            args, agent=agent, kube=kube, health=health, mig=mig, pod_resources=pod_resources
        )
        started.stoppers.append(stop_dra)
        started.stoppers.append(
            start_pod_usage(
                args,
                agent=agent,
                backend=self.backend,
                metrics=self.metrics,
                kube=kube,
                pod_resources=pod_resources,
                share_memory=dra.preparer.share_of if dra is not None else None,
            )
        )
        if args.metrics_address:
            started.stoppers.append(_serve_metrics(args.metrics_address, self.metrics))
        return started

    def imex(
        self,
        kube: KubeParts,
        agent: NodeAgent,
        *,
        config_dir: Path | None,
        source: ImexSource | None = None,
    ) -> Callable[[], None]:
        """Start the node's one IMEX reconciler (docs/nvlink-domains.md) over ``source``: the pod
        view by default (device-plugin mode), the claims' GpuImexDomain in DRA mode. It serves only
        while the node is in a multi-node NVLink domain, so on every other node it writes nothing."""
        writer = ImexConfigWriter(config_dir or self.state_dir / "imex", simulated=self.simulated)
        reconciler = ImexReconciler(
            source or kube.view,
            node=self.node_name,
            clique=lambda: node_clique(agent),
            peers=kube.clique_peers(),
            writer=writer,
            metrics=ImexMetrics(self.metrics.registry),
        )
        reconciler.start()
        return reconciler.stop

    def _start_dra(
        self,
        args: argparse.Namespace,
        *,
        agent: NodeAgent,
        kube: KubeParts | None,
        health: HealthService,
        mig: MigService,
        pod_resources: PodResourcesClient | None,
    ) -> tuple[Callable[[], None], NodeDra | None]:
        """DRA mode's plugin, slice publisher and IMEX reconciler (``--dra``; needs the API server,
        checked at start); returns what stops them, and them."""
        if not args.dra or kube is None:
            log.warning("node agent serving %s from %s", ", ".join(agent.resource_names()), args.kubelet_dir)
            return (lambda: None), None
        dra = NodeDraStarter(
            args,
            agent=agent,
            backend=self.backend,
            api=kube.api,
            health=health,
            node=self.node_name,
            mig_service=mig,
            pod_resources=pod_resources,
        ).start()
        stop_imex = self.imex(kube, agent, config_dir=args.imex_config_dir, source=dra.imex)

        def stop() -> None:
            stop_imex()
            dra.stop()

        return stop, dra


def node_clique(agent: NodeAgent) -> str | None:
    """The node's NVLink clique (``<cluster UUID>.<clique ID>``), None off a multi-node domain."""
    fabric = agent.inventory.nvswitch
    return fabric.clique if fabric is not None else None


def _open_mig_kube(kube: KubeParts, node: str, mig: MigService, *, demand: bool) -> MigKube:
    """MIG's Node watch (declared layout) and, with ``demand``, its pending-pod watch, on the agent's
    API client; imported only with an API server (--no-kube runs load no kubernetes client)."""
    from mig.kube import start_mig_kube  # noqa: PLC0415 (deferred: memory and start-up time)

    return start_mig_kube(kube.api, node, mig, demand=demand)


def _serve_metrics(address: str, metrics: AgentMetrics) -> Callable[[], None]:
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        raise GpuweaveError(f"--metrics-address {address!r}: expected HOST:PORT, e.g. 0.0.0.0:9402")
    return serve_metrics(metrics.registry, host=host or "0.0.0.0", port=int(port))
