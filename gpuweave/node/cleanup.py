"""``gpuweave node-agent --cleanup``: what the node agent leaves on its node, and its removal.

The agent writes to its Node (the GFD-style labels and ``gpuweave.io/topology``, its health taints,
its cordon and the annotation that marks it as its own, its conditions), its ``GpuNodeInventory``,
and files on the host: CDI specs (``gpuweave-*.json``, and per DRA claim), its sockets in the
kubelet's directories, and its state directory (status file, control socket, MIG journal, health
strikes and cursor, GPU identities, MPS ledger, DRA checkpoint, a simulated node's files).

This module decides, from data, what of that goes: ``node_patch`` (the Node's metadata and spec),
``conditions_patch`` (its status) and ``host_paths`` (files and directories, read from listings).
The bad-hardware list (``bad-hardware.json``, ``health-strikes.json``) is kept unless asked: it is
the record of GPUs taken out of service, which a reinstall should not hand back to work
(docs/deploy.md, "Uninstall"). ``gpuweave.node.cleanup_run`` applies the decisions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dradriver.claim_cdi import CLAIM_FILE_PREFIX
from health.badlist import BAD_HARDWARE_FILE, STRIKES_FILE
from health.kube import CORDON_ANNOTATION
from health.links_file import DEGRADED_LINKS_FILE
from health.scope import (
    AGENT_CONDITIONS,
    TAINT_HEALTH_PENDING,
    TAINT_NODE_FAULT,
)
from nodeagent.cdi import SPEC_FILE_PREFIX
from nodeagent.published import AGENT_LABEL_KEYS, LABEL_TOPOLOGY

AGENT_TAINTS = frozenset({TAINT_NODE_FAULT, TAINT_HEALTH_PENDING})
AGENT_ANNOTATIONS = frozenset({CORDON_ANNOTATION})
# what the node's hardware showed: kept with ``--keep-bad-hardware``
BAD_HARDWARE_FILES = frozenset({BAD_HARDWARE_FILE, STRIKES_FILE, DEGRADED_LINKS_FILE})
DEVICE_PLUGIN_SOCKET_PREFIX = "gpuweave-"  # deviceplugin/server.py: gpuweave-<resource>.sock
DRA_DRIVER_DIR = "gpuweave.io"  # <kubelet root>/plugins/gpuweave.io/ (dradriver/plugin.py)
DRA_REGISTRATION_SOCKET = "gpuweave.io-reg.sock"  # <kubelet root>/plugins_registry/


@dataclass(frozen=True)
class NodeLeftovers:
    """What of the agent's a Node carries (empty: nothing to remove)."""

    labels: tuple[str, ...]
    taints: tuple[str, ...]
    annotations: tuple[str, ...]
    conditions: tuple[str, ...]
    cordoned_by_agent: bool

    def __bool__(self) -> bool:
        return bool(
            self.labels or self.taints or self.annotations or self.conditions or self.cordoned_by_agent
        )

    def describe(self) -> str:
        parts = [
            f"labels {', '.join(self.labels)}" if self.labels else "",
            f"taints {', '.join(self.taints)}" if self.taints else "",
            f"annotations {', '.join(self.annotations)}" if self.annotations else "",
            f"conditions {', '.join(self.conditions)}" if self.conditions else "",
            "its cordon" if self.cordoned_by_agent else "",
        ]
        return "; ".join(p for p in parts if p) or "nothing"


def leftovers(node: Mapping[str, Any]) -> NodeLeftovers:
    """The agent's labels, taints, annotation, conditions and cordon on ``node`` (a Node as the API
    server serves it, camelCase)."""
    metadata = node.get("metadata") or {}
    spec = node.get("spec") or {}
    labels = metadata.get("labels") or {}
    annotations = metadata.get("annotations") or {}
    taints = [t.get("key") for t in spec.get("taints") or []]
    conditions = [c.get("type") for c in (node.get("status") or {}).get("conditions") or []]
    ours = annotations.get(CORDON_ANNOTATION) == "true"
    return NodeLeftovers(
        labels=tuple(sorted(k for k in labels if k in AGENT_LABEL_KEYS)),
        taints=tuple(sorted({k for k in taints if k in AGENT_TAINTS})),
        annotations=tuple(sorted(k for k in annotations if k in AGENT_ANNOTATIONS)),
        conditions=tuple(c for c in AGENT_CONDITIONS if c in conditions),
        cordoned_by_agent=ours and bool(spec.get("unschedulable")),
    )


def marked_by_gpuweave(found: NodeLeftovers) -> bool:
    """Whether a Node carries a mark only gpuweave writes (``gpuweave.io/topology``, its taints,
    annotation or ``Gpuweave*`` conditions). The GFD-style ``nvidia.com/*`` labels alone do not say
    so: NVIDIA's GPU Feature Discovery writes the same ones on nodes gpuweave never ran on."""
    ours = found.taints or found.annotations or found.cordoned_by_agent
    return bool(
        ours or LABEL_TOPOLOGY in found.labels or any(c.startswith("Gpuweave") for c in found.conditions)
    )


def node_patch(node: Mapping[str, Any]) -> dict[str, Any] | None:
    """A merge patch of ``node`` that removes the agent's labels, taints, annotation and cordon
    (None: nothing to remove). Every other taint goes back exactly as read, and the Node's
    resourceVersion is a precondition, so a change made in between is never undone. A cordon is
    undone only where the agent's annotation says the agent made it (as the agent itself does)."""
    found = leftovers(node)
    if not (found.labels or found.taints or found.annotations or found.cordoned_by_agent):
        return None
    metadata: dict[str, Any] = {"resourceVersion": (node.get("metadata") or {}).get("resourceVersion")}
    if found.labels:
        metadata["labels"] = dict.fromkeys(found.labels)
    if found.annotations:
        metadata["annotations"] = dict.fromkeys(found.annotations)
    patch: dict[str, Any] = {"metadata": metadata}
    spec: dict[str, Any] = {}
    if found.taints:
        spec["taints"] = [
            t for t in (node.get("spec") or {}).get("taints") or [] if t.get("key") not in AGENT_TAINTS
        ]
    if found.cordoned_by_agent:
        spec["unschedulable"] = False
    if spec:
        patch["spec"] = spec
    return patch


def conditions_patch(node: Mapping[str, Any]) -> dict[str, Any] | None:
    """A strategic merge patch of the Node's status deleting the agent's conditions (None: none)."""
    found = leftovers(node).conditions
    if not found:
        return None
    return {"status": {"conditions": [{"type": c, "$patch": "delete"} for c in found]}}


@dataclass(frozen=True)
class HostPlaces:
    """Where the agent keeps things on the host (the flags it ran with)."""

    state_dir: Path
    kubelet_dir: Path  # <kubelet root>/device-plugins
    cdi_spec_dir: Path | None
    keep_bad_hardware: bool = True

    @property
    def kubelet_root(self) -> Path:
        return self.kubelet_dir.parent


def state_entries_to_remove(names: Iterable[str], *, keep_bad_hardware: bool) -> list[str]:
    """The state directory's entries that go: all of them, but the bad-hardware list when kept."""
    return sorted(n for n in names if not (keep_bad_hardware and n in BAD_HARDWARE_FILES))


def cdi_files_to_remove(names: Iterable[str]) -> list[str]:
    """The agent's own spec files (``gpuweave-*`` from the device plugin, ``gpuweave.io-claim_*``
    from DRA); the runtime's and other vendors' specs stay."""
    ours = (SPEC_FILE_PREFIX, CLAIM_FILE_PREFIX)
    return sorted(n for n in names if n.startswith(ours) and n.endswith((".json", ".yaml")))


def device_plugin_sockets_to_remove(names: Iterable[str]) -> list[str]:
    """The agent's device-plugin sockets; the kubelet's own and other plugins' stay."""
    return sorted(n for n in names if n.startswith(DEVICE_PLUGIN_SOCKET_PREFIX) and n.endswith(".sock"))


def host_paths(places: HostPlaces, listings: Mapping[Path, Sequence[str]]) -> list[Path]:
    """Every path to remove, from ``listings`` (directory -> the names in it; a directory that is
    absent is left out). The state directory itself goes when nothing of it is kept."""

    def names(directory: Path | None) -> Sequence[str]:
        return listings.get(directory, ()) if directory is not None else ()

    state = state_entries_to_remove(names(places.state_dir), keep_bad_hardware=places.keep_bad_hardware)
    paths = [places.state_dir / n for n in state]
    if places.cdi_spec_dir is not None and not _inside(places.cdi_spec_dir, places.state_dir):
        paths += [places.cdi_spec_dir / n for n in cdi_files_to_remove(names(places.cdi_spec_dir))]
    paths += [places.kubelet_dir / n for n in device_plugin_sockets_to_remove(names(places.kubelet_dir))]
    registry = places.kubelet_root / "plugins_registry"
    if DRA_REGISTRATION_SOCKET in names(registry):
        paths.append(registry / DRA_REGISTRATION_SOCKET)
    plugins = places.kubelet_root / "plugins"
    if DRA_DRIVER_DIR in names(plugins):
        paths.append(plugins / DRA_DRIVER_DIR)
    return paths


def _inside(path: Path, directory: Path) -> bool:
    return path == directory or directory in path.parents


def listed_directories(places: HostPlaces) -> list[Path]:
    """The directories ``host_paths`` reads listings of."""
    dirs = [places.state_dir, places.kubelet_dir, places.kubelet_root / "plugins_registry"]
    dirs.append(places.kubelet_root / "plugins")
    return dirs + ([places.cdi_spec_dir] if places.cdi_spec_dir is not None else [])
