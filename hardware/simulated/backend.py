"""The simulated backend: the production NVML and sysfs readers over a simulated node.

``SimulatedBackend`` is ``NvmlBackend(lib=SimulatedNvmlLib(node))`` reading a fake sysfs tree
written for the same node, so discovery in tests and in ``gpuweave simulate`` runs the code a GPU
host runs. What it discovers equals ``profile.to_inventory()`` (the contract suite checks it).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from devicemodel.inventory import NodeInventory
from devicemodel.spec import NodeProfile
from hardware.nvml import NvmlBackend
from hardware.nvml_call import DEFAULT_CALL_TIMEOUT_S
from hardware.simulated.lib import SimulatedNvmlLib
from hardware.simulated.node import SimulatedNode
from hardware.simulated.sysfs_tree import write_fake_sysfs

# Memory-backed, like the kernel's /sys: creating the ~850 files, directories and links of a large
# node's tree on a disk-backed /tmp took 0.7-1.4 s of the agent's start-up, on tmpfs about 25 ms.
MEMORY_SCRATCH_DIR = Path("/dev/shm")


def scratch_parent() -> str | None:
    """Where a temporary tree goes: the memory-backed ``/dev/shm`` when writable, else the temp dir."""
    if MEMORY_SCRATCH_DIR.is_dir() and os.access(MEMORY_SCRATCH_DIR, os.W_OK | os.X_OK):
        return str(MEMORY_SCRATCH_DIR)
    return None


class SimulatedBackend:
    """A ``GpuBackend`` for a profile (or a prepared ``SimulatedNode``).

    ``sysfs_root``: where to write the fake tree (it gets a ``sys/`` directory); None makes a
    temporary directory (in memory where possible, see ``scratch_parent``) that ``close()``
    removes. ``node``, ``lib`` and ``sysfs_root`` are public so tests and the simulator inject
    faults and make further calls through the same objects. ``exerciser_faults``: the file that
    keeps the node's active-check faults (bad memory cells, slow NVLink pairs) across restarts.
    """

    def __init__(
        self,
        profile: NodeProfile | SimulatedNode,
        sysfs_root: Path | str | None = None,
        *,
        node_name: str | None = None,
        call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
        kmsg_path: Path | None = None,
        identity_file: Path | None = None,
        exerciser_faults: Path | None = None,
    ) -> None:
        self._temporary = sysfs_root is None
        if sysfs_root is None:
            sysfs_root = tempfile.mkdtemp(prefix="gpuweave-sysfs-", dir=scratch_parent())
        self.sysfs_root = Path(sysfs_root)
        if isinstance(profile, SimulatedNode):
            self.node = profile
        else:
            inventory = profile.to_inventory(node_name=node_name)
            self.node = SimulatedNode(
                inventory, sysfs_root=self.sysfs_root, kmsg_path=kmsg_path, exerciser_faults=exerciser_faults
            )
            for gpu in profile.spec.gpus:
                if gpu.lost:
                    self.node.set_gpu_lost(gpu.index)  # off the bus before the driver's first answer
            if profile.spec.nvswitch is not None and profile.spec.nvswitch.fabric_state is not None:
                self.node.health.fabric_state = profile.spec.nvswitch.fabric_state
        layout = write_fake_sysfs(self.sysfs_root, self.node)
        self.lib = SimulatedNvmlLib(self.node)
        self.nvml = NvmlBackend(
            lib=self.lib,
            sysfs_root=self.sysfs_root,
            call_timeout_s=call_timeout_s,
            node_name=self.node.inventory.name,
            switch_names=layout.switch_names,
            root_port_names=layout.root_port_names,
            identity_file=identity_file,
        )

    @property
    def inventory(self) -> NodeInventory:
        """The inventory the node was built from (what ``discover`` should find)."""
        return self.node.inventory

    def discover(self) -> NodeInventory:
        return self.nvml.discover()

    def close(self) -> None:
        self.node.release_hangs()
        self.nvml.close()
        if self._temporary:
            shutil.rmtree(self.sysfs_root, ignore_errors=True)
