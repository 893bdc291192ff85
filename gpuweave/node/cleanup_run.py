"""Applies ``gpuweave.node.cleanup``'s decisions: the agent's Node labels, taints, annotation,
cordon and conditions, its ``GpuNodeInventory``, and its files on the host.

Every step is idempotent (a second run finds nothing and says so), so a cleanup cut short is
finished by running it again: the uninstall DaemonSet's init container is retried by the kubelet
until it succeeds (docs/deploy.md, "Uninstall").
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from devicemodel.contracts import API_GROUP, API_VERSION, NODE_INVENTORY_PLURAL
from devicemodel.errors import GpuweaveError
from gpuweave.node.cleanup import (
    HostPlaces,
    NodeLeftovers,
    conditions_patch,
    host_paths,
    leftovers,
    listed_directories,
    node_patch,
)
from health.kube import NODE_PATCH_ATTEMPTS
from kubeio.errors import CONFLICT, NOT_FOUND, status_of
from nodeagent.control import CONTROL_SOCKET

log = logging.getLogger(__name__)


def refuse_if_agent_runs(state_dir: Path) -> None:
    """A running agent would publish again what the cleanup removes: its control socket answering
    means one runs on this node (stop it first: the uninstall DaemonSet replaces it)."""
    path = state_dir / CONTROL_SOCKET
    if not path.exists():
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(str(path))
    except OSError:
        return  # a socket left by an agent that is gone: removed below
    finally:
        probe.close()
    raise GpuweaveError(f"a node agent is running on this node ({path} answers): stop it before --cleanup")


def remove_host_state(places: HostPlaces) -> list[Path]:
    """Remove the agent's files and directories on the host; the paths removed."""
    listings: dict[Path, list[str]] = {}
    for directory in listed_directories(places):
        try:
            listings[directory] = os.listdir(directory)
        except (FileNotFoundError, NotADirectoryError):
            continue
    removed = []
    for path in host_paths(places, listings):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
        removed.append(path)
    state = places.state_dir
    # the chart mounts the state directory into the container: the empty mount point stays
    if state.is_dir() and not os.listdir(state) and not os.path.ismount(state):
        state.rmdir()
        removed.append(state)
    return removed


def clean_node_objects(api: client.ApiClient, *, node_name: str) -> NodeLeftovers:
    """Remove the agent's labels, taints, annotation, cordon and conditions from ``node_name`` and
    delete its GpuNodeInventory; what the Node carried before (empty when nothing)."""
    core = client.CoreV1Api(api)
    found = _patch_node(core, node_name)
    status = conditions_patch(_as_dict(core, core.read_node_status(node_name)))
    if status is not None:
        core.patch_node_status(node_name, status)
    delete_inventory(api, node_name)
    return found


def delete_inventory(api: client.ApiClient, node_name: str) -> bool:
    """Delete ``node_name``'s GpuNodeInventory; False when there was none."""
    custom = client.CustomObjectsApi(api)
    try:
        custom.delete_cluster_custom_object(API_GROUP, API_VERSION, NODE_INVENTORY_PLURAL, node_name)
    except ApiException as exc:
        if status_of(exc) == NOT_FOUND:
            return False
        raise
    return True


def _patch_node(core: client.CoreV1Api, node_name: str) -> NodeLeftovers:
    """The Node patched with its resourceVersion as a precondition: a change in between (the
    kubelet's, an operator's taint) is read again and kept, up to ``NODE_PATCH_ATTEMPTS`` times."""
    found = NodeLeftovers((), (), (), (), cordoned_by_agent=False)
    for attempt in range(1, NODE_PATCH_ATTEMPTS + 1):
        node = _as_dict(core, core.read_node(node_name))
        found = found if attempt > 1 else leftovers(node)
        patch = node_patch(node)
        if patch is None:
            return found
        try:
            core.patch_node(node_name, patch)
            return found
        except ApiException as exc:
            if status_of(exc) != CONFLICT or attempt == NODE_PATCH_ATTEMPTS:
                raise
    return found


def _as_dict(core: client.CoreV1Api, node: Any) -> dict[str, Any]:
    return as_dict(core.api_client, node)


def as_dict(api: client.ApiClient, obj: Any) -> dict[str, Any]:
    """An object of the client as the API server serves it (camelCase keys)."""
    serialized: dict[str, Any] = api.sanitize_for_serialization(obj)  # type: ignore[no-untyped-call]
    return serialized
