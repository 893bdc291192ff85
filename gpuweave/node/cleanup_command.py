"""``gpuweave node-agent --cleanup``: the flags and the run (``gpuweave.node.cleanup`` decides what
goes, ``gpuweave.node.cleanup_run`` removes it).

The cleanup reads the same ``--state-dir``, ``--kubelet-dir``, ``--cdi-spec-dir``, ``--simulate``
and API-server flags as the agent, so the uninstall DaemonSet (``gpuweave uninstall``) runs it
with the agent's own command line plus ``--cleanup``. With ``--no-kube`` only the host is cleaned.
"""

from __future__ import annotations

import argparse
import logging

from devicemodel.errors import GpuweaveError
from gpuweave.node.cdi import spec_dir
from gpuweave.stopping import stop_on_signals, wait_for

log = logging.getLogger(__name__)


def add_cleanup_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add(
        "--cleanup",
        action="store_true",
        help="remove what the agent left on this node instead of running it: its Node labels, taints, "
        "annotation, cordon and conditions, its GpuNodeInventory, CDI specs, sockets and state "
        "(the bad-hardware list is kept: --remove-bad-hardware); then exit (docs/deploy.md)",
    )
    add(
        "--then-wait",
        action="store_true",
        help="with --cleanup: after removing, wait for SIGTERM (the uninstall DaemonSet's container)",
    )
    add(
        "--remove-bad-hardware",
        action="store_true",
        help="with --cleanup: remove this node's bad-hardware list (STATE_DIR/bad-hardware.json) too",
    )


def run_cleanup(args: argparse.Namespace, *, node: str) -> int:
    if not args.cleanup:
        raise GpuweaveError("--then-wait and --remove-bad-hardware go with --cleanup")
    # deferred, as the agent's own API-server side: a node agent that never cleans loads none of it
    from gpuweave.node.cleanup import HostPlaces  # noqa: PLC0415
    from gpuweave.node.cleanup_run import (  # noqa: PLC0415
        clean_node_objects,
        refuse_if_agent_runs,
        remove_host_state,
    )
    from kubeio.client import api_client  # noqa: PLC0415

    refuse_if_agent_runs(args.state_dir)
    if args.kubeconfig or args.in_cluster:
        api = api_client(args.kubeconfig)
        try:
            found = clean_node_objects(api, node_name=node)
        finally:
            api.close()  # type: ignore[no-untyped-call]
        print(f"node {node}: removed {found.describe()} from the Node, and its GpuNodeInventory", flush=True)
    places = HostPlaces(
        state_dir=args.state_dir,
        kubelet_dir=args.kubelet_dir,
        cdi_spec_dir=spec_dir(args),
        keep_bad_hardware=not args.remove_bad_hardware,
    )
    removed = remove_host_state(places)
    shown = ", ".join(str(p) for p in removed) or "nothing left"
    print(f"node {node}: removed from the host: {shown}", flush=True)
    if not args.remove_bad_hardware:
        print(
            f"node {node}: kept the bad-hardware list under {args.state_dir} (--remove-bad-hardware)",
            flush=True,
        )
    if args.then_wait:
        wait_for(stop_on_signals())
    return 0
