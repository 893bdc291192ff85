"""`gpuweave uninstall`: every node agent cleans its node, then a sweep of what none reached.

The Helm chart runs it as its pre-delete hook; with kustomize run it before ``kubectl delete -k``.
Why it works this way, and not as a hook per node or on the agent's SIGTERM, is
``gpuweave.node.uninstall``'s docstring.
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from devicemodel.contracts import API_GROUP, API_VERSION, NODE_INVENTORY_PLURAL
from devicemodel.errors import GpuweaveError
from gpuweave.node.cleanup import leftovers, marked_by_gpuweave
from gpuweave.node.cleanup_run import as_dict, clean_node_objects, delete_inventory
from gpuweave.node.uninstall import cleaned_nodes, cleanup_daemonset, is_cleanup, rollout
from kubeio.client import api_client
from kubeio.errors import NOT_FOUND, describe, status_of

log = logging.getLogger(__name__)
POLL_S = 2.0


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "uninstall",
        help="before removing gpuweave: every node agent removes what it left on its node (docs/deploy.md)",
        description="Turn the node-agent DaemonSet into its cleanup (node-agent --cleanup on every node), "
        "wait for it, then remove from the API what no agent reached. The Helm chart runs it as its "
        "pre-delete hook; it deletes none of the release's own objects.",
    )
    kube = parser.add_mutually_exclusive_group()
    kube.add_argument("--kubeconfig", type=Path, default=None, help="the API server's kubeconfig")
    kube.add_argument("--in-cluster", action="store_true", help="the pod's own service account")
    parser.add_argument("--namespace", default="gpuweave-system", help="the node agent's namespace")
    parser.add_argument("--daemonset", default="gpuweave-node-agent", help="the node agent's DaemonSet")
    parser.add_argument(
        "--timeout", type=float, default=240.0, help="seconds to wait for the nodes' cleanup (default 240)"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.timeout <= 0:
        raise GpuweaveError(f"--timeout must be positive, not {args.timeout}")
    api = api_client(args.kubeconfig)
    try:
        reached = clean_through_daemonset(
            api, namespace=args.namespace, name=args.daemonset, timeout=args.timeout
        )
        unreached = sweep(api, reached=reached)
    except ApiException as exc:  # RBAC, an outage: one line naming the call, not a traceback
        raise GpuweaveError(f"the API server refused: {describe(exc)}") from None
    finally:
        api.close()  # type: ignore[no-untyped-call]
    if unreached:
        print(
            f"WARNING: no node agent cleaned {', '.join(sorted(unreached))}: their Node objects are clean, "
            "their host state is not; run `gpuweave node-agent --cleanup --no-kube` there",
            flush=True,
        )
    return 0


def clean_through_daemonset(api: client.ApiClient, *, namespace: str, name: str, timeout: float) -> set[str]:
    """Roll the DaemonSet into its cleanup and wait; the nodes whose cleanup succeeded."""
    apps = client.AppsV1Api(api)
    try:
        current: dict[str, Any] = as_dict(api, apps.read_namespaced_daemon_set(name, namespace))
    except ApiException as exc:
        if status_of(exc) != NOT_FOUND:
            raise
        print(f"no DaemonSet {namespace}/{name}: no node is cleaned by its agent", flush=True)
        return set()
    if not is_cleanup(current["spec"]["template"]):
        apps.replace_namespaced_daemon_set(name, namespace, cleanup_daemonset(current))  # type: ignore[arg-type]
        print(f"DaemonSet {namespace}/{name}: every node agent replaced by its cleanup", flush=True)
    deadline = time.monotonic() + timeout
    while True:
        state = rollout(as_dict(api, apps.read_namespaced_daemon_set(name, namespace)))
        if state.done or time.monotonic() >= deadline:
            break
        time.sleep(POLL_S)
    print(f"DaemonSet {namespace}/{name}: {state.describe()}", flush=True)
    pods = client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=_selector(current))
    return cleaned_nodes(as_dict(api, pods).get("items") or [])


def _selector(daemonset: dict[str, Any]) -> str:
    labels = daemonset["spec"]["selector"].get("matchLabels") or {}
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def sweep(api: client.ApiClient, *, reached: set[str]) -> set[str]:
    """Remove the agent's marks from every Node gpuweave ran on (one with a GpuNodeInventory or a
    mark only gpuweave writes: ``marked_by_gpuweave``) and delete every GpuNodeInventory; the nodes
    that carried something and no agent cleaned."""
    custom = client.CustomObjectsApi(api)
    listed: Any = custom.list_cluster_custom_object(API_GROUP, API_VERSION, NODE_INVENTORY_PLURAL)
    inventories = {item["metadata"]["name"] for item in listed.get("items") or []}
    unreached = set()
    for node in as_dict(api, client.CoreV1Api(api).list_node()).get("items") or []:
        name = node["metadata"]["name"]
        found = leftovers(node)
        if name not in inventories and not marked_by_gpuweave(found):
            continue  # not a node of gpuweave's, whatever nvidia.com labels another tool wrote
        if found:
            clean_node_objects(api, node_name=name)
            print(f"node {name}: removed {found.describe()}", flush=True)
        if name not in reached:
            unreached.add(name)
    for name in sorted(inventories):  # those of nodes that are gone too
        try:
            delete_inventory(api, name)
        except ApiException as exc:
            log.warning("GpuNodeInventory %s: %s", name, describe(exc))
    return unreached
