"""`gpuweave node-agent`: run the node agent: device plugin servers, health, MIG, publishing.

The node-agent process: its flags (checked in one line before anything starts), the node's name,
the API-server connection (``--kubeconfig`` or ``--in-cluster``: publisher, the handoff's pod
watch, MIG's Node watch) and the kubelet's pod-resources API, the refusal to start beside another
plugin serving the same resources, and SIGTERM/SIGINT, which stop everything (servers closed,
sockets removed). What the agent is made of and the order its parts start in is
``gpuweave.node.builder``: the same builder composes the simulated cluster's agents.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

from devicemodel.errors import GpuweaveError
from devicemodel.sharing import SharingPlan, load_sharing_plan
from deviceplugin.coexistence import refuse_if_served_by_another
from gpuweave.node.builder import NodeAgentBuilder, open_backend
from gpuweave.node.cdi import add_cdi_arguments, cdi_publisher, check_cdi_arguments, device_listing
from gpuweave.node.cleanup_command import add_cleanup_arguments, run_cleanup
from gpuweave.node.dra import add_dra_arguments, check_dra_arguments
from gpuweave.node.health import load_settings
from gpuweave.node.mps import process_daemons
from gpuweave.node.sharing import (
    add_sharing_arguments,
    check_sharing_arguments,
    chosen_sharing_config,
    node_labels_of,
)
from gpuweave.node.usage import add_usage_arguments
from gpuweave.stopping import stop_on_signals, wait_for
from hardware.backend import GpuBackend
from health.persist import require_writable_dir
from health.signals.fabric import DEFAULT_INTERVAL_S as DEFAULT_FABRIC_INTERVAL_S
from nodeagent.agent import AgentConfig
from nodeagent.devices import build_catalogue
from nodeagent.metrics import AgentMetrics
from nodeagent.podresources import PodResourcesClient, default_socket_for

if TYPE_CHECKING:
    from deviceplugin.kube import KubeParts

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
    add(
        "--imex-config-dir",
        type=Path,
        default=None,
        help="where the IMEX daemon's nodes_config.cfg is written for the job holding the node's IMEX "
        "channel (default STATE_DIR/imex; /etc/nvidia-imex for a host's nvidia-imex; "
        "docs/nvlink-domains.md); needs the API server",
    )
    add_sharing_arguments(parser)
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
    add_usage_arguments(parser)
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
    add_cleanup_arguments(parser)
    parser.set_defaults(handler=run)


def node_name(args: argparse.Namespace) -> str:
    return str(args.node_name or os.environ.get("NODE_NAME") or socket.gethostname())


def open_kube(kubeconfig: Path | None, *, node: str, metrics: AgentMetrics) -> KubeParts:
    """The API-server side (``kubeconfig`` None: the in-cluster service account), imported only with
    --kubeconfig or --in-cluster: --no-kube runs load no kubernetes client."""
    from deviceplugin.kube import KubeParts  # noqa: PLC0415 (deferred: memory and start-up time)

    return KubeParts(kubeconfig, node=node, metrics=metrics)


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


def agent_config(args: argparse.Namespace, backend: GpuBackend, *, sharing_file: Path | None) -> AgentConfig:
    """The agent's configuration from the flags and the node's sharing file (read here)."""
    sharing = load_sharing_plan(sharing_file) if sharing_file else SharingPlan()
    return AgentConfig(
        kubelet_dir=args.kubelet_dir,
        state_dir=args.state_dir,
        sharing=sharing,
        rediscover_interval=args.rediscover_interval,
        device_listing=device_listing(args, backend),
        serve_device_plugins=not args.dra,
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
    check_sharing_arguments(args, with_kube=with_kube)
    return with_kube


def run(args: argparse.Namespace) -> int:
    if args.cleanup or args.then_wait or args.remove_bad_hardware:
        return run_cleanup(args, node=node_name(args))
    with_kube = check_args(args)
    health_settings = load_settings(args.health_config)  # every configuration read before any start
    node = node_name(args)
    metrics = AgentMetrics()
    kube = open_kube(args.kubeconfig, node=node, metrics=metrics) if with_kube else None
    sharing_file = chosen_sharing_config(args, labels=node_labels_of(kube.api, node) if kube else None)
    backend = open_backend(args.simulate, node_name=node, state_dir=args.state_dir)
    builder = NodeAgentBuilder(backend, state_dir=args.state_dir, node_name=node, metrics=metrics)
    agent = builder.agent(
        agent_config(args, backend, sharing_file=sharing_file),
        handoff=kube.handoff if kube else None,
        cdi=None if args.dra else cdi_publisher(args, backend),  # DRA writes a spec per prepared claim
    )
    stop = stop_on_signals()
    pod_resources = open_pod_resources(args)
    inventory = backend.discover()
    try:  # before any socket or registration of ours
        served = build_catalogue(inventory, agent.config.sharing)
        if not args.dra:  # DRA mode registers no device-plugin resource
            refuse_if_served_by_another(args.kubelet_dir, resources=served)
        mps = builder.mps(
            agent,
            daemons=process_daemons(args.mps_control, state_dir=args.state_dir, simulated=builder.simulated),
            inventory=inventory,
            sharing_config=sharing_file,
        )
    except GpuweaveError:
        backend.close()
        raise
    try:  # the state files (MIG journal, bad-hardware list, DRA checkpoint) are read from here on
        parts = builder.start_parts(
            args,
            agent=agent,
            kube=kube,
            mps=mps,
            inventory=inventory,
            pod_resources=pod_resources,
            health_settings=health_settings,
            mig_mode=mig_mode(args),
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
