"""The host's device nodes that a GPU or EFA container needs, with their device numbers.

A CDI spec names each device node with its type and major:minor so that a runtime can create it in
the container without looking at the host path (the CDI library only stats a node it was not told
about). The numbers come from where the kernel publishes them:

- ``/dev/nvidia<minor>``, ``nvidiactl`` (minor 255) and ``nvidia-modeset`` (254) belong to the
  NVIDIA driver's major (``/proc/devices``: ``nvidia-frontend`` or ``nvidia``; 195 on every driver
  so far); ``nvidia-uvm`` (minor 0) and ``nvidia-uvm-tools`` (1) to ``nvidia-uvm``'s dynamic major.
- MIG access capabilities are ``/dev/nvidia-caps/nvidia-cap<minor>`` under the ``nvidia-caps``
  major, the minor listed in ``/proc/driver/nvidia-caps/mig-minors`` as ``gpu<G>/gi<I>/access`` and
  ``gpu<G>/gi<I>/ci<C>/access`` (``G`` is the GPU's device minor).
- ``/dev/infiniband/uverbs<N>`` from ``/sys/class/infiniband_verbs/uverbs<N>/dev``, ``rdma_cm``
  from ``/sys/class/misc/rdma_cm/dev`` (libfabric's EFA provider opens both).

A node listed under ``root/dev`` that is a real character device gives its own numbers (``st_rdev``);
the simulator's tree holds plain files there and the numbers above. Everything is read below
``root`` (``/`` on a node) so tests read a simulated host with the same code.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

NVIDIA_MAJOR = 195  # the NVIDIA driver's registered character major
NVIDIACTL_MINOR = 255
NVIDIA_MODESET_MINOR = 254
MIG_MINORS_FILE = "proc/driver/nvidia-caps/mig-minors"
RDMA_CM = "/dev/infiniband/rdma_cm"


@dataclass(frozen=True)
class CharDevice:
    """A character device node: its path on the host (and in the container) and its numbers."""

    path: str
    major: int
    minor: int


@dataclass(frozen=True)
class HostDeviceNodes:
    """What ``read_host_device_nodes`` found; absent nodes are simply not listed."""

    control: tuple[CharDevice, ...] = ()  # nvidiactl, nvidia-uvm, nvidia-uvm-tools, nvidia-modeset
    nvidia_major: int = NVIDIA_MAJOR
    caps_major: int | None = None
    mig_minors: dict[str, int] = field(default_factory=dict, hash=False)  # "gpu0/gi1/access" -> minor
    uverbs: dict[str, CharDevice] = field(default_factory=dict, hash=False)  # by path
    rdma_cm: CharDevice | None = None

    def gpu_node(self, minor: int) -> CharDevice:
        return CharDevice(f"/dev/nvidia{minor}", self.nvidia_major, minor)

    def mig_caps(self, gpu_minor: int, *, gi: int, ci: int) -> tuple[CharDevice, ...] | None:
        """The GPU-instance and compute-instance access nodes of one MIG device, or None when the
        driver lists no minor for them (no ``nvidia-caps`` major or no ``mig-minors`` entry)."""
        gi_key = f"gpu{gpu_minor}/gi{gi}/access"
        ci_key = f"gpu{gpu_minor}/gi{gi}/ci{ci}/access"
        if self.caps_major is None or gi_key not in self.mig_minors or ci_key not in self.mig_minors:
            return None
        return tuple(
            CharDevice(
                f"/dev/nvidia-caps/nvidia-cap{self.mig_minors[key]}", self.caps_major, self.mig_minors[key]
            )
            for key in (gi_key, ci_key)
        )


def _char_majors(root: Path) -> dict[str, int]:
    """``/proc/devices``' character section: driver name -> major."""
    try:
        text = (root / "proc" / "devices").read_text(encoding="utf-8")
    except OSError:
        return {}
    majors: dict[str, int] = {}
    in_char = False
    for line in text.splitlines():
        if line.strip().endswith(":"):
            in_char = line.strip() == "Character devices:"
            continue
        number, _, name = line.strip().partition(" ")
        if in_char and number.isdigit() and name:
            majors.setdefault(name.strip(), int(number))
    return majors


def _node(root: Path, path: str, *, major: int | None, minor: int) -> CharDevice | None:
    """The node at ``path`` when it exists: its own numbers when it is a character device."""
    try:
        info = os.stat(root / path.lstrip("/"))
    except OSError:
        return None
    if stat.S_ISCHR(info.st_mode):
        return CharDevice(path, os.major(info.st_rdev), os.minor(info.st_rdev))
    return None if major is None else CharDevice(path, major, minor)


def _dev_file(path: Path) -> tuple[int, int] | None:
    """A sysfs ``dev`` file's ``major:minor``."""
    try:
        major, _, minor = path.read_text(encoding="utf-8").strip().partition(":")
        return int(major), int(minor)
    except (OSError, ValueError):
        return None


def _mig_minors(root: Path) -> dict[str, int]:
    minors: dict[str, int] = {}
    try:
        lines = (root / MIG_MINORS_FILE).read_text(encoding="utf-8").splitlines()
    except OSError:
        return minors
    for line in lines:
        name, _, number = line.strip().rpartition(" ")
        if name and number.isdigit():
            minors[name] = int(number)
    return minors


def _uverbs(root: Path) -> dict[str, CharDevice]:
    found: dict[str, CharDevice] = {}
    verbs = root / "sys" / "class" / "infiniband_verbs"
    for entry in sorted(verbs.iterdir()) if verbs.is_dir() else []:
        numbers = _dev_file(entry / "dev")
        if entry.name.startswith("uverbs") and numbers is not None:
            path = f"/dev/infiniband/{entry.name}"
            found[path] = CharDevice(path, *numbers)
    return found


def _rdma_cm(root: Path) -> CharDevice | None:
    numbers = _dev_file(root / "sys" / "class" / "misc" / "rdma_cm" / "dev")
    if numbers is None:
        return None
    return _node(root, RDMA_CM, major=numbers[0], minor=numbers[1]) or CharDevice(RDMA_CM, *numbers)


def read_host_device_nodes(root: Path = Path("/")) -> HostDeviceNodes:
    """Read the host's GPU and RDMA device nodes below ``root``."""
    majors = _char_majors(root)
    nvidia = majors.get("nvidia-frontend", majors.get("nvidia", NVIDIA_MAJOR))
    uvm = majors.get("nvidia-uvm")
    wanted = (
        ("/dev/nvidiactl", nvidia, NVIDIACTL_MINOR),
        ("/dev/nvidia-uvm", uvm, 0),
        ("/dev/nvidia-uvm-tools", uvm, 1),
        ("/dev/nvidia-modeset", nvidia, NVIDIA_MODESET_MINOR),
    )
    control = tuple(
        node for path, major, minor in wanted if (node := _node(root, path, major=major, minor=minor))
    )
    return HostDeviceNodes(
        control=control,
        nvidia_major=nvidia,
        caps_major=majors.get("nvidia-caps"),
        mig_minors=_mig_minors(root),
        uverbs=_uverbs(root),
        rdma_cm=_rdma_cm(root),
    )
