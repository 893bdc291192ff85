"""Refuse to share a node with another device plugin that serves one of our resource names.

The kubelet keeps one registration per resource name, the last one: if the NVIDIA device plugin
(standalone or from the GPU operator) or the EKS EFA device plugin also runs on the node, each
re-registration takes ``nvidia.com/gpu``, ``nvidia.com/mig-*`` or ``vpc.amazonaws.com/efa`` from
the other, pods are admitted by whichever won last and allocations flap. So the agent looks in the
kubelet's device-plugin directory before it registers: a socket that another process listens on,
named as those plugins name theirs, stops the start with one line saying which component to turn
off. A socket file nobody listens on (a plugin that exited) is only logged: the kubelet removes it
on its next restart.
"""

from __future__ import annotations

import logging
import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from devicemodel.contracts import RESOURCE_EFA, RESOURCE_GPU
from deviceplugin.server import socket_name_for
from nodeagent.errors import DevicePluginError

log = logging.getLogger(__name__)
MIG_PREFIX = "nvidia.com/mig-"
_NVIDIA_FIX = (
    "the NVIDIA device plugin: with the GPU operator set devicePlugin.enabled=false (and gfd.enabled=false, "
    "migManager.enabled=false), else delete the nvidia-device-plugin DaemonSet or keep it off this node"
)
_EFA_FIX = (
    "the EKS EFA device plugin: uninstall the aws-efa-k8s-device-plugin chart (or its DaemonSet) "
    "or keep it off gpuweave nodes"
)


@dataclass(frozen=True)
class _Known:
    pattern: re.Pattern[str]
    resource: str  # with {name} from the pattern
    component: str


_KNOWN = (
    _Known(re.compile(r"^nvidia-(?P<name>[A-Za-z0-9._+-]+)\.sock$"), "nvidia.com/{name}", _NVIDIA_FIX),
    _Known(re.compile(r"^aws-efa-device-plugin\.sock$"), RESOURCE_EFA, _EFA_FIX),
)


@dataclass(frozen=True)
class ForeignPlugin:
    socket: Path
    resource: str
    component: str


def foreign_plugins(kubelet_dir: Path) -> list[ForeignPlugin]:
    """Live sockets of known other device plugins in ``kubelet_dir``, with the resource each serves."""
    found = []
    for path in sorted(kubelet_dir.glob("*.sock")):
        for known in _KNOWN:
            match = known.pattern.match(path.name)
            if match is None:
                continue
            resource = known.resource.format(**match.groupdict())
            if _listening(path):
                found.append(ForeignPlugin(path, resource, known.component))
            else:
                log.warning("stale device-plugin socket %s (%s): nobody listens on it", path, resource)
    return found


def refuse_if_served_by_another(kubelet_dir: Path, *, resources: Iterable[str]) -> None:
    """Raise ``DevicePluginError`` (one line) when another live plugin serves one of ``resources``
    or any MIG resource (our MIG names change with every reshape)."""
    ours = set(resources) | {RESOURCE_GPU}
    ours_names = {socket_name_for(r) for r in ours}
    for plugin in foreign_plugins(kubelet_dir):
        clash = plugin.resource in ours or plugin.resource.startswith(MIG_PREFIX)
        if clash and plugin.socket.name not in ours_names:
            raise DevicePluginError(
                f"another device plugin already serves {plugin.resource} on this node "
                f"(socket {plugin.socket}); the kubelet keeps only the last registration per resource, "
                f"so both would flap. Disable {plugin.component}, then start gpuweave's node agent "
                "(docs/deploy.md)"
            )


def _listening(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True
