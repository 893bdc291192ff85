"""The simulated host's ``/dev`` and the ``/proc`` files that give device numbers.

Written next to the fake sysfs tree so ``hardware.device_nodes.read_host_device_nodes(root)`` reads
a simulated node exactly as it reads a real one:

- ``proc/devices``: the character majors the NVIDIA driver, UVM, ``nvidia-caps`` and the verbs
  driver register (UVM's and ``nvidia-caps``' are dynamic; these are typical values).
- ``proc/driver/nvidia-caps/mig-minors``: the driver's fixed table of MIG access-capability minors,
  ``config`` 1, ``monitor`` 2, then per GPU minor 15 GPU instances, each followed by its 8 compute
  instances (``gpu0/gi0/access`` 3, ``gpu0/gi0/ci0/access`` 4, ..., ``gpu0/gi1/access`` 12).
- ``sys/class/misc/rdma_cm/dev`` when the node has an RDMA adapter.
- ``dev/...``: an empty file per node (a test process cannot ``mknod``); the reader takes numbers
  from the files above when a node is not a real character device.
"""

from __future__ import annotations

from pathlib import Path

from devicemodel.contracts import imex_channel_path
from devicemodel.inventory import NicType, NodeInventory

MAX_GPU_MINORS = 32
GPU_INSTANCES_PER_GPU = 15
COMPUTE_INSTANCES_PER_GI = 8
UVM_MAJOR, CAPS_MAJOR, MISC_MAJOR, RDMA_CM_MINOR = 508, 509, 10, 58
_CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")


def mig_minor_lines() -> list[str]:
    """The driver's ``mig-minors`` table, one ``name minor`` line each."""
    lines = ["config 1", "monitor 2"]
    minor = 3
    for gpu in range(MAX_GPU_MINORS):
        for gi in range(GPU_INSTANCES_PER_GPU):
            lines.append(f"gpu{gpu}/gi{gi}/access {minor}")
            minor += 1
            for ci in range(COMPUTE_INSTANCES_PER_GI):
                lines.append(f"gpu{gpu}/gi{gi}/ci{ci}/access {minor}")
                minor += 1
    return lines


def _proc_devices() -> str:
    return "\n".join(
        [
            "Character devices:",
            f" {MISC_MAJOR} misc",
            "195 nvidia-frontend",
            "231 infiniband_verbs",
            f"{UVM_MAJOR} nvidia-uvm",
            f"{CAPS_MAJOR} nvidia-caps",
            "",
            "Block devices:",
            "259 blkext",
        ]
    )


def _touch(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()


def write_fake_dev(root: Path, inventory: NodeInventory) -> None:
    """Write ``dev/``, ``proc/devices``, the MIG minors table and ``rdma_cm``'s numbers under ``root``."""
    root = Path(root)
    (root / "proc" / "driver" / "nvidia-caps").mkdir(parents=True, exist_ok=True)
    (root / "proc" / "devices").write_text(_proc_devices() + "\n", encoding="utf-8")
    (root / "proc" / "driver" / "nvidia-caps" / "mig-minors").write_text(
        "\n".join(mig_minor_lines()) + "\n", encoding="utf-8"
    )
    for name in _CONTROL_NODES:
        _touch(root / "dev" / name)
    for gpu in inventory.gpus:
        _touch(root / "dev" / f"nvidia{gpu.minor}")
    for cap in ("nvidia-cap1", "nvidia-cap2"):
        _touch(root / "dev" / "nvidia-caps" / cap)
    if inventory.nvswitch is not None and inventory.nvswitch.clique is not None:
        # IMEX channel 0, as the driver creates it with NVreg_CreateImexChannel0=1 on NVL72 nodes
        _touch(root / imex_channel_path(0).lstrip("/"))
    rdma = [n for n in inventory.nics if n.type in (NicType.EFA, NicType.INFINIBAND) and n.uverbs_device]
    for nic in rdma:
        _touch(root / str(nic.uverbs_device).lstrip("/"))
    if rdma:
        _touch(root / "dev" / "infiniband" / "rdma_cm")
        misc = root / "sys" / "class" / "misc" / "rdma_cm"
        misc.mkdir(parents=True, exist_ok=True)
        (misc / "dev").write_text(f"{MISC_MAJOR}:{RDMA_CM_MINOR}\n", encoding="utf-8")
