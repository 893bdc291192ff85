"""`gpuweave node-agent`: run the node agent: device plugin servers, health, MIG, publishing.

The composition root of the node-agent process: it picks the hardware source (simulated profile
or the real GPUs), the sharing plan, the topology chooser and, with ``--kubeconfig``, the
publisher, the handoff's pod watch and MIG's Node watch; starts the agent; and stops everything
on SIGTERM/SIGINT (servers closed, sockets removed).
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from devicemodel.errors import GpuweaveError
from devicemodel.inventory import NodeInventory
from devicemodel.sharing import SharingPlan, load_sharing_plan
from deviceplugin.agent import AgentConfig, NodeAgent
from deviceplugin.coexistence import refuse_if_served_by_another
from deviceplugin.devices import build_catalogue
from deviceplugin.metrics import AgentMetrics, serve_metrics
from deviceplugin.mps import MpsSettings
from deviceplugin.podresources import PodResourcesClient, default_socket_for
from deviceplugin.topology_choice import gpu_chooser_for
from gpuweave.node.cdi import add_cdi_arguments, cdi_publisher, check_cdi_arguments, device_listing
from gpuweave.node.dra import add_dra_arguments, check_dra_arguments, start_node_dra
from gpuweave.node.fabric import fabric_gate
from gpuweave.node.health import SIM_KMSG_FILE, load_settings, mig_recreator, start_node_health
from gpuweave.node.mig import build_mig_service, register_mig_routes
from gpuweave.node.mps import MpsRoundHook, NodeMps, control_command, mps_base_dir, start_node_mps
from gpuweave.stopping import stop_on_signals, wait_for
from hardware.backend import GpuBackend
from hardware.gpu_identity import IDENTITY_FILE
from hardware.host_check import run_self_check
from hardware.mps import ProcessMpsDaemons
from hardware.nvml import NvmlBackend
from hardware.profiles import load_profile
from hardware.simulated.backend import SimulatedBackend
from health.config import HealthSettings
from health.persist import require_writable_dir
from health.signals.fabric import DEFAULT_INTERVAL_S as DEFAULT_FABRIC_INTERVAL_S
from mig.service import MigService

if TYPE_CHECKING:
    from deviceplugin.kube import KubeParts
    from mig.kube import MigKube

log = logging.getLogger(__name__)
MIG_MODES = ("off", "declared", "demand")

DEFAULT_KUBELET_DIR = "/var/lib/kubelet/device-plugins"
DEFAULT_STATE_DIR = "/var/run/gpuweave"


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "node-agent",
        help="run the node agent: device plugin servers (or a DRA driver: --dra), health, MIG, publishing",
        description="Serve the kubelet device-plugin API for GPUs, MIG devices, fractional GPUs and EFA, "
        "or with --dra serve every device through Dynamic Resource Allocation instead (docs/dra.md).",
    )
    add = parser.add_argument
    add("--kubelet-dir", type=Path, default=Path(DEFAULT_KUBELET_DIR), help="kubelet device-plugin directory")
    add("--state-dir", type=Path, default=Path(DEFAULT_STATE_DIR), help="holds agent.sock and agent.json")
    parser.add_argument("--simulate", metavar="PROFILE|FILE", help="simulated hardware from a node profile")
    parser.add_argument("--node-name", default=None, help="node name (default: $NODE_NAME or the hostname)")
    add(
        "--rediscover-interval",
        type=float,
        default=30.0,
        help="seconds between hardware re-discoveries (0: off)",
    )
    add(
        "--metrics-address",
        metavar="HOST:PORT",
        default=None,
        help="serve Prometheus /metrics (default: off)",
    )
    add(
        "--fabric-check-interval",
        type=float,
        default=DEFAULT_FABRIC_INTERVAL_S,
        help="seconds between NVSwitch fabric checks; GPUs wait for the fabric (docs/deploy.md)",
    )
    add("--sharing-config", type=Path, default=None, help="per-GPU sharing YAML (kind SharingConfig)")
    add("--health-config", type=Path, default=None, help="health settings YAML (docs/health.md)")
    add(
        "--mps-control",
        metavar="PATH",
        default=None,
        help="the MPS control program run per fractional GPU (default: nvidia-cuda-mps-control; "
        "with --simulate the simulated one; docs/device-plugin.md)",
    )
    add_cdi_arguments(parser)
    add_dra_arguments(parser)
    kube = parser.add_mutually_exclusive_group()
    kube.add_argument(
        "--kubeconfig", type=Path, default=None, help="publish and read pods through this kubeconfig"
    )
    kube.add_argument(
        "--in-cluster",
        action="store_true",
        help="publish and read pods through the pod's own service account (instead of --kubeconfig)",
    )
    kube.add_argument("--no-kube", action="store_true", help="run with no API server")
    add(
        "--pod-resources-socket",
        metavar="PATH",
        default=None,
        help="kubelet pod-resources API socket, read for the devices pods hold (default: "
        "<kubelet root>/pod-resources/kubelet.sock when --kubelet-dir is <kubelet root>/device-plugins; "
        "'none' turns it off; docs/device-plugin.md)",
    )
    add(
        "--mig-mode",
        choices=MIG_MODES,
        default="declared",
        help="off: no reshape comes from Kubernetes (the layout NVML shows stays; a journalled reshape "
        "cut short is still finished, `gpuweave mig apply` still works); declared: it applies its "
        "Node's gpuweave.io/mig-layout annotation; "
        "demand: as declared, and it reshapes for pending pods' nvidia.com/mig-* requests "
        "(needs --kubeconfig or --in-cluster; docs/mig.md). Default: declared",
    )
    add("--mig-demand", action="store_true", help="the same as --mig-mode demand (the older form)")
    add(
        "--correct-assignments",
        action="store_true",
        help="patch a pod's gpuweave.io/assignment to the devices the kubelet really allocated when "
        "they differ (needs pods patch: manifests/rbac-node-agent-assignments.yaml; docs/device-plugin.md)",
    )
    parser.set_defaults(handler=run)


def node_name(args: argparse.Namespace) -> str:
    return str(args.node_name or os.environ.get("NODE_NAME") or socket.gethostname())


def open_backend(args: argparse.Namespace) -> GpuBackend:
    """The hardware source: the node's GPUs through NVML and sysfs, or a simulated node profile read
    by the same NVML/sysfs code."""
    args.state_dir.mkdir(parents=True, exist_ok=True)
    identities = args.state_dir / IDENTITY_FILE  # names a GPU that stops answering, across restarts
    if args.simulate:
        return SimulatedBackend(
            load_profile(args.simulate),
            node_name=node_name(args),
            kmsg_path=args.state_dir / SIM_KMSG_FILE,
            identity_file=identities,
        )
    check = run_self_check()  # before the driver: name every missing prerequisite in one line
    if check.fatal:
        raise GpuweaveError(check.line())
    if check.missing:
        log.warning("%s", check.line())
    return NvmlBackend(node_name=node_name(args), identity_file=identities)


def open_kube(kubeconfig: Path | None, *, node: str, metrics: AgentMetrics) -> KubeParts:
    """The API-server side (``kubeconfig`` None: the in-cluster service account), imported only with
    --kubeconfig or --in-cluster: --no-kube runs load no kubernetes client."""
    from deviceplugin.kube import KubeParts  # noqa: PLC0415 (deferred: memory and start-up time)

    return KubeParts(kubeconfig, node=node, metrics=metrics)


def open_metrics(address: str, metrics: AgentMetrics) -> Callable[[], None]:
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        raise GpuweaveError(f"--metrics-address {address!r}: expected HOST:PORT, e.g. 0.0.0.0:9402")
    return serve_metrics(metrics.registry, host=host or "0.0.0.0", port=int(port))


def open_mig_kube(kube: KubeParts, node: str, mig: MigService, *, demand: bool) -> MigKube:
    """MIG's Node watch (declared layout) and, with ``demand``, its pending-pod watch, on the agent's
    API client; imported only with an API server, as ``open_kube`` is."""
    from mig.kube import start_mig_kube  # noqa: PLC0415 (deferred: memory and start-up time)

    return start_mig_kube(kube.api, node, mig, demand=demand)


def open_pod_resources(args: argparse.Namespace) -> PodResourcesClient | None:
    """The kubelet's pod-resources API (the devices pods hold), or None when turned off or not
    derivable; the agent starts either way and an unreachable API is reported when it is read."""
    value = args.pod_resources_socket
    if value is not None and value.strip().lower() in ("", "none"):
        path = None
    else:
        path = Path(value) if value is not None else default_socket_for(args.kubelet_dir)
    if path is None:
        log.warning(
            "no kubelet pod-resources socket (--pod-resources-socket): MIG busy checks see running "
            "processes and recent grants only, health eviction only the extender's annotations"
        )
        return None
    return PodResourcesClient(path)


def build_agent(
    args: argparse.Namespace, *, backend: GpuBackend, kube: KubeParts | None, metrics: AgentMetrics
) -> NodeAgent:
    sharing = load_sharing_plan(args.sharing_config) if args.sharing_config else SharingPlan()
    config = AgentConfig(
        kubelet_dir=args.kubelet_dir,
        state_dir=args.state_dir,
        sharing=sharing,
        rediscover_interval=args.rediscover_interval,
        device_listing=device_listing(args, backend),
        serve_device_plugins=not args.dra,
    )
    return NodeAgent(
        config,
        discover=backend.discover,
        chooser_for=gpu_chooser_for,
        handoff=kube.handoff if kube else None,
        metrics=metrics,
        cdi=None if args.dra else cdi_publisher(args, backend),  # DRA writes a spec per prepared claim
    )


def open_mps(args: argparse.Namespace, agent: NodeAgent, inventory: NodeInventory) -> NodeMps:
    """One MPS control daemon per fractional GPU, started before the first device list (a GPU
    without a live daemon is withheld from it)."""
    simulated = bool(args.simulate)
    base_dir = mps_base_dir(agent.config.sharing, state_dir=args.state_dir, simulated=simulated)
    return start_node_mps(
        agent,
        daemons=ProcessMpsDaemons(control_command(args.mps_control, simulated=simulated)),
        inventory=inventory,
        settings=MpsSettings(base_dir=base_dir),
        sharing_config=args.sharing_config,
    )


def mig_mode(args: argparse.Namespace) -> str:
    """off, declared or demand; ``--mig-demand`` (the older form) means demand."""
    return "demand" if args.mig_demand else str(args.mig_mode)


def check_args(args: argparse.Namespace) -> bool:
    """Refuse a bad command line in one line before anything starts; True when an API server is used."""
    if not args.kubelet_dir.is_dir():
        raise GpuweaveError(f"kubelet device-plugin directory {args.kubelet_dir} does not exist")
    require_writable_dir(args.state_dir)  # a read-only or uncreatable state dir: one line, not a traceback
    check_cdi_arguments(args)  # a bad --device-list-strategy: one line, before any hardware is opened
    with_kube = bool(args.kubeconfig or args.in_cluster)
    if args.mig_demand and args.mig_mode not in ("declared", "demand"):
        raise GpuweaveError(f"--mig-demand contradicts --mig-mode {args.mig_mode}: give one of them")
    if mig_mode(args) == "demand" and not with_kube:
        flag = "--mig-demand" if args.mig_demand else "--mig-mode demand"
        raise GpuweaveError(
            f"{flag} watches pending pods through the API server: give --kubeconfig too (or --in-cluster)"
        )
    if args.correct_assignments and not with_kube:
        raise GpuweaveError("--correct-assignments patches pods: give --kubeconfig too (or --in-cluster)")
    check_dra_arguments(args, with_kube=with_kube)
    return with_kube


def open_dra(
    args: argparse.Namespace,
    *,
    agent: NodeAgent,
    backend: GpuBackend,
    kube: KubeParts | None,
    health: Any,
    mig: MigService,
    pod_resources: PodResourcesClient | None,
) -> Callable[[], None]:
    """DRA mode's plugin and slice publisher (``--dra``; needs the API server, checked at start);
    returns what stops them."""
    if not args.dra or kube is None:
        log.warning("node agent serving %s from %s", ", ".join(agent.resource_names()), args.kubelet_dir)
        return lambda: None
    dra = start_node_dra(
        args,
        agent=agent,
        backend=backend,
        api=kube.api,
        health=health,
        node=node_name(args),
        mig_service=mig,
        pod_resources=pod_resources,
    )
    return dra.stop


@dataclass
class _Started:
    """What ``_start_parts`` started, stopped in the reverse order."""

    stoppers: list[Callable[[], None]] = field(default_factory=list)

    def stop(self) -> None:
        for stopper in reversed(self.stoppers):
            stopper()


def _start_parts(
    args: argparse.Namespace,
    *,
    agent: NodeAgent,
    backend: GpuBackend,
    kube: Any,
    metrics: AgentMetrics,
    mps: NodeMps,
    inventory: NodeInventory,
    pod_resources: Any,
    health_settings: HealthSettings,
) -> _Started:
    """MIG, fabric gate, the agent's servers, health, publishing, DRA and metrics, in that order."""
    started = _Started()
    mig = build_mig_service(
        agent, backend=backend, state_dir=args.state_dir, inventory=inventory, pod_resources=pod_resources
    )
    mig.begin_restore()  # GPUs whose journalled MIG layout NVML does not show: withheld from the first list
    fabric = fabric_gate(agent, backend, interval_s=args.fabric_check_interval)
    fabric.check(inventory)  # GPUs on an untrained NVSwitch fabric are withheld from the first list
    agent.start()
    mig.restore_in_background()  # the other GPUs serve while those are restored, one by one
    fabric.start(lambda: agent.inventory)
    started.stoppers.append(fabric.stop)
    register_mig_routes(agent, mig)
    mode = mig_mode(args)
    if kube is not None and mode != "off":
        started.stoppers.append(open_mig_kube(kube, node_name(args), mig, demand=mode == "demand").stop)
    health = start_node_health(
        agent,
        backend=backend,
        state_dir=args.state_dir,
        node_name=node_name(args),
        settings=health_settings,
        kube_api=kube.api if kube else None,
        metrics=metrics,
        recreate_mig=mig_recreator(mig, agent),
        gpu_owners=mig.reconciler.owners,
        pod_devices=pod_resources.pod_devices if pod_resources is not None else None,
        round_hooks=(MpsRoundHook(mps),),
        kill_mps=mps.kill,
        taints_evict=bool(args.dra),  # DRA: NoExecute device taints, evicted by kube-controller-manager
    )
    started.stoppers.append(health.stop)
    if kube is not None:
        kube.start(
            agent,
            kubelet_devices=pod_resources.list_devices if pod_resources is not None else None,
            correct_assignments=args.correct_assignments,
        )
    started.stoppers.append(
        open_dra(
            args, agent=agent, backend=backend, kube=kube, health=health, mig=mig, pod_resources=pod_resources
        )
    )
    if args.metrics_address:
        started.stoppers.append(open_metrics(args.metrics_address, metrics))
    return started


def run(args: argparse.Namespace) -> int:
    with_kube = check_args(args)
    health_settings = load_settings(args.health_config)  # every configuration read before any start
    metrics = AgentMetrics()
    kube = open_kube(args.kubeconfig, node=node_name(args), metrics=metrics) if with_kube else None
    backend = open_backend(args)
    agent = build_agent(args, backend=backend, kube=kube, metrics=metrics)
    stop = stop_on_signals()
    pod_resources = open_pod_resources(args)
    inventory = backend.discover()
    try:  # before any socket or registration of ours
        served = build_catalogue(inventory, agent.config.sharing)
        if not args.dra:  # DRA mode registers no device-plugin resource
            refuse_if_served_by_another(args.kubelet_dir, resources=served)
        mps = open_mps(args, agent, inventory)
    except GpuweaveError:
        backend.close()
        raise
    try:  # the state files (MIG journal, bad-hardware list, DRA checkpoint) are read from here on
        parts = _start_parts(
            args,
            agent=agent,
            backend=backend,
            kube=kube,
            metrics=metrics,
            mps=mps,
            inventory=inventory,
            pod_resources=pod_resources,
            health_settings=health_settings,
        )
    except BaseException:  # a refused start leaves no MPS daemon behind (they are processes of their own)
        mps.stop()
        agent.stop()
        backend.close()
        raise
    try:
        wait_for(stop)
    finally:
        parts.stop()
        mps.stop()
        if kube is not None:
            kube.stop()
        agent.stop()
        backend.close()
    return 0
