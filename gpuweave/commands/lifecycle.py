"""`gpuweave lifecycle`: hand broken nodes to their engine; ask the autoscaler for capacity.

One active replica (a Lease); see docs/node-lifecycle.md. The controllers read the cluster every
``--interval`` seconds and act only through the engine's own objects: a NodeClaim or Machine
deleted, a node condition, CapacityBuffers.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import threading
from pathlib import Path
from typing import Any

from kubernetes import client

from devicemodel.errors import InvalidInputError
from gpuweave.lifecycle.capacity_config import load_capacity_config
from gpuweave.lifecycle.kube_capacity import KubeCapacity
from gpuweave.lifecycle.kube_replace import KubeReplacement
from gpuweave.lifecycle.replace import ReplacementPolicy
from gpuweave.lifecycle.service import Controller, LifecycleService, ReplacementController
from gpuweave.stopping import stop_on_signals, wait_for
from kubeio.client import api_client
from kubeio.lease import LeaseElector

log = logging.getLogger(__name__)


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text}: a fraction in (0, 1]")
    return value


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "lifecycle",
        help="hand broken nodes to their engine (Karpenter, Cluster API); CapacityBuffers for GPU demand",
        description=(
            "Replacement: a node whose agent says only a reboot or a new machine helps "
            "(GpuweaveNodeServiceable=False) is handed to its engine: its Karpenter NodeClaim or "
            "Cluster API Machine is deleted (the engine drains and replaces it), the condition "
            "AcceleratedHardwareReady=False is set (what Karpenter's AWS repair reads), its failed "
            "GPUs go on the bad-hardware list. Pods labelled gpuweave.io/no-node-replacement=true, "
            "disruption budgets and a cluster-wide cap hold it back. One active replica (a Lease)."
        ),
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--kubeconfig", metavar="FILE", help="the cluster (default $KUBECONFIG)")
    source.add_argument("--in-cluster", action="store_true", help="use the pod's service account")
    parser.add_argument("--interval", type=float, default=2.0, metavar="S", help="seconds between rounds")
    parser.add_argument("--no-replacement", action="store_true", help="do not run the replacement controller")
    parser.add_argument(
        "--engine",
        choices=("auto", "condition"),
        default="auto",
        help="auto: delete the node's NodeClaim or Machine where it has one; condition: only publish "
        "AcceleratedHardwareReady=False for an engine that repairs on it (default auto)",
    )
    parser.add_argument(
        "--reboot",
        choices=("replace", "leave"),
        default="replace",
        help="a node that needs a reboot: replace it (no reboot path), or leave it to one (default replace)",
    )
    parser.add_argument(
        "--disruption-cap",
        type=_fraction,
        default=0.1,
        metavar="FRACTION",
        help="at most this fraction of GPU nodes handed over at once, at least one (default 0.1)",
    )
    parser.add_argument(
        "--pdb-override",
        action="store_true",
        help="hand a failed node over even when a PodDisruptionBudget allows no eviction now",
    )
    parser.add_argument(
        "--capacity-config",
        type=Path,
        metavar="FILE",
        help="run the capacity controller: pending shares, MIG profiles and tier-bound gangs become "
        "CapacityBuffers for the node pools this file lists (kind CapacityConfig)",
    )
    parser.add_argument(
        "--capacity-cooldown",
        type=float,
        default=600.0,
        metavar="S",
        help="a buffer whose machines came up while its pods still fit nowhere is not asked for "
        "again for this long (default 600)",
    )
    parser.add_argument(
        "--gang-settle",
        type=float,
        default=20.0,
        metavar="S",
        help="a gang's members ask for whole GPUs, which the autoscaler acts on by itself: buffer only "
        "what its machines leave missing from one tier, once the gang has waited this long (default 20)",
    )
    lease = parser.add_argument_group("leader election")
    lease.add_argument("--lease-namespace", default="gpuweave-system", help="the Lease's namespace")
    lease.add_argument("--lease-name", default="gpuweave-lifecycle", help="the Lease's name")
    lease.add_argument("--identity", default=None, help="this replica's name (default host name and pid)")
    lease.add_argument("--no-leader-election", action="store_true", help="run as the only replica")
    parser.set_defaults(handler=run)


def build_service(args: argparse.Namespace, api: client.ApiClient) -> LifecycleService:
    controllers: list[Controller] = []
    if not args.no_replacement:
        policy = ReplacementPolicy(
            cap_fraction=args.disruption_cap, reboot=args.reboot, pdb_override=args.pdb_override
        )
        controllers.append(ReplacementController(KubeReplacement(api, engine_mode=args.engine), policy))
    if args.capacity_config is not None:
        config = load_capacity_config(args.capacity_config)
        controllers.append(
            KubeCapacity(api, config, cooldown_s=args.capacity_cooldown, gang_settle_s=args.gang_settle)
        )
    if not controllers:
        raise InvalidInputError("every controller is off: drop --no-replacement or give --capacity-config")
    elector = None
    if not args.no_leader_election:
        identity = args.identity or f"{socket.gethostname()}-{os.getpid()}"
        elector = LeaseElector(
            client.CoordinationV1Api(api),
            namespace=args.lease_namespace,
            name=args.lease_name,
            identity=identity,
        )
    return LifecycleService(controllers, elector=elector, interval_s=args.interval)


def run(args: argparse.Namespace) -> int:
    kubeconfig = args.kubeconfig or os.environ.get("KUBECONFIG") or None
    if kubeconfig is None and not args.in_cluster:
        raise InvalidInputError("no cluster: give --kubeconfig FILE, set KUBECONFIG, or --in-cluster")
    api = api_client(Path(kubeconfig) if kubeconfig else None)
    service = build_service(args, api)
    stop = stop_on_signals()
    worker = threading.Thread(target=service.run, args=(stop,), name="lifecycle", daemon=True)
    worker.start()
    try:
        wait_for(stop)
    finally:
        stop.set()
        worker.join(30)
        api.close()  # type: ignore[no-untyped-call]
    return 0
