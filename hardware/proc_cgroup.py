"""Which pod and container a process runs in, from its ``/proc/<pid>/cgroup``.

The kubelet puts each pod in a cgroup named after its UID and each container in one named after
its runtime ID, in one of two layouts, whichever cgroup driver it runs with:

- cgroupfs: ``/kubepods/burstable/pod<uid>/<container id>`` (``besteffort/``, or no QoS level for
  a Guaranteed pod; CRI-O names the leaf ``crio-<id>``);
- systemd: ``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid, "-" as "_">.slice/
  cri-containerd-<id>.scope`` (``crio-``, ``docker-``).

The kernel writes the file, not the container, and a container can only nest cgroups below its
own, so the first pod and container directory of the path are the process's. Only the first
64 KiB are read: a process in thousands of cgroup v1 hierarchies still costs one bounded read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

MAX_CGROUP_BYTES = 64 * 1024
_CGROUPFS = re.compile(r"/kubepods(?:/(?:burstable|besteffort))?/pod([0-9a-fA-F-]{8,64})/([^/\s]+)")
_SYSTEMD = re.compile(
    r"kubepods(?:-burstable|-besteffort)?-pod([0-9a-fA-F_]{8,64})\.slice/([^/\s]+?)(?:\.scope)?(?:/|$)"
)
_RUNTIME_PREFIXES = ("cri-containerd-", "crio-", "docker-", "containerd-")
_CONTAINER_ID = re.compile(r"^[0-9a-zA-Z]{6,128}$")


@dataclass(frozen=True)
class ContainerCgroup:
    pod_uid: str
    container_id: str  # the runtime's ID, without its prefix (``containerd://`` in a pod's status)


def _container_id(leaf: str) -> str | None:
    for prefix in _RUNTIME_PREFIXES:
        if leaf.startswith(prefix):
            leaf = leaf[len(prefix) :]
            break
    leaf = leaf.removesuffix(".scope")
    return leaf if _CONTAINER_ID.match(leaf) else None


def parse_cgroup(text: str) -> ContainerCgroup | None:
    """The pod and container of a ``/proc/<pid>/cgroup`` text (v1 or v2 lines), or None for a
    process outside every pod (the agent, the MPS server, a host daemon)."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        for pattern, uid_of in ((_CGROUPFS, str), (_SYSTEMD, lambda u: u.replace("_", "-"))):
            match = pattern.search(path)
            if match is None:
                continue
            container = _container_id(match[2])
            if container is not None:
                return ContainerCgroup(uid_of(match[1]).lower(), container)
    return None


def container_of(proc_root: Path, pid: int) -> ContainerCgroup | None:
    """The pod and container of process ``pid`` under ``proc_root`` (None: gone, or in no pod)."""
    try:
        with (proc_root / str(int(pid)) / "cgroup").open("rb") as file:
            raw = file.read(MAX_CGROUP_BYTES)
    except OSError:
        return None
    return parse_cgroup(raw.decode("utf-8", errors="replace"))
