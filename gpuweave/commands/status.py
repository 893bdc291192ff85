"""`gpuweave status`: what runs on which GPU, what is withheld, how fragmented; `--explain` one pod.

The cluster is read once (``gpuweave.status.cluster_list``: the extender's own list calls) or
taken from a snapshot file, loaded into the extender's own cache (``ClusterView``) and shown as
rows (``gpuweave.status.rows``) or as one pod's decision (``gpuweave.status.explain``).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from devicemodel.errors import InvalidInputError
from gpuweave.status.cluster_list import list_cluster
from gpuweave.status.cluster_view import ClusterView, Object
from gpuweave.status.explain import explain
from gpuweave.status.rows import cluster_status
from gpuweave.status.text import explain_text, status_text, to_json
from kubeio.client import api_client
from scheduler_ext.api import load_workload_file, read_objects

DEFAULT_KUBECONFIG = Path.home() / ".kube" / "config"


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "status",
        help="show GPUs, their pods, health and fragmentation; explain one pod's placement",
        description=(
            "Per node and GPU: sharing mode, the pods holding it (whole, MIG device, share), health "
            "and its reason, MIG layout, bad-hardware entries, and the fragment the extender's scorer "
            "weighs, per node and cluster-wide, read through the extender's own cache. --explain "
            "NAMESPACE/POD: for a pending pod the rejection reasons counted across nodes and what "
            "would make it fit; for a placed pod its devices, their topology score and the runners-up."
        ),
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--kubeconfig", metavar="FILE", help="the cluster to read (default $KUBECONFIG, else ~/.kube/config)"
    )
    source.add_argument("--in-cluster", action="store_true", help="read the cluster this pod runs in")
    source.add_argument("--snapshot", metavar="FILE", help="read a Kubernetes List (YAML or JSON) instead")
    parser.add_argument("--node", metavar="NODE", help="show this node only")
    parser.add_argument(
        "--explain", metavar="NAMESPACE/POD", help="explain the extender's decision for one pod"
    )
    parser.add_argument(
        "--workload",
        metavar="FILE",
        help="measure fragmentation against this workload (as `gpuweave extender --workload`)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON for scripts instead of tables")
    parser.set_defaults(handler=run)


def _objects(args: argparse.Namespace) -> list[Object]:
    if args.snapshot:
        return read_objects(Path(args.snapshot))
    kubeconfig = args.kubeconfig or os.environ.get("KUBECONFIG") or None
    if kubeconfig is None and not args.in_cluster:
        if not DEFAULT_KUBECONFIG.exists():
            raise InvalidInputError(
                "no cluster to read: give --kubeconfig FILE, set KUBECONFIG, --in-cluster or --snapshot FILE"
            )
        kubeconfig = str(DEFAULT_KUBECONFIG)
    api = api_client(kubeconfig)
    try:
        return list(list_cluster(api))
    finally:
        api.close()  # type: ignore[no-untyped-call]


def run(args: argparse.Namespace) -> int:
    if args.explain and "/" not in args.explain:
        raise InvalidInputError(
            f"--explain {args.explain!r}: give NAMESPACE/POD, for example default/train-0"
        )
    workload = load_workload_file(Path(args.workload)) if args.workload else None
    objects = _objects(args)
    if args.explain:
        answer = explain(objects, args.explain, workload=workload)
        print(to_json(answer) if args.json else explain_text(answer))
        return 0
    status = cluster_status(ClusterView.of(objects, workload=workload), node=args.node)
    if args.node and not status.nodes and not status.without_inventory:
        raise InvalidInputError(f"node {args.node} is not in the cluster; `kubectl get nodes` lists them")
    print(to_json(status) if args.json else status_text(status))
    return 0
