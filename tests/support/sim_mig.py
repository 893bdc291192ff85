"""A MIG reconciler and service over the simulated NVML library, as the node agent wires them.

Unit tests, transport tests and the MIG benchmark build the same stack: a simulated node's
pynvml surface, ``MigOps`` with the node as GPU resetter, a journal in the given directory and
the default MIG catalog.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from devicemodel.inventory import NodeInventory
from hardware.mig_catalog import default_catalog
from hardware.mig_ops import MigOps
from hardware.profiles import load_profile
from hardware.simulated.lib import SimulatedNvmlLib
from hardware.simulated.node import SimulatedNode
from mig.journal import MigJournal
from mig.reconciler import GpuRef, MigReconciler
from mig.service import MigService


def mig_reconciler(
    lib: SimulatedNvmlLib, inventory: NodeInventory, journal_dir: Path, **options: Any
) -> MigReconciler:
    """A reconciler for every GPU of ``inventory`` on an initialised ``lib``; ``options`` (hooks,
    clock, fault) go to ``MigReconciler`` as they are."""
    assert lib.mig_node is not None
    return MigReconciler(
        ops=MigOps(lib, resetter=lib.mig_node),
        journal=MigJournal(journal_dir),
        catalog=default_catalog(),
        gpus=[GpuRef(g.index, g.uuid, g.product) for g in inventory.gpus],
        **options,
    )


def sim_mig_service(journal_dir: Path, *, profile: str = "dgx-h100") -> tuple[MigService, SimulatedNvmlLib]:
    """A ``MigService`` on a fresh simulated node of ``profile``, and that node's library."""
    inventory = load_profile(profile).to_inventory()
    lib = SimulatedNvmlLib(SimulatedNode(inventory))
    lib.nvmlInit()
    return MigService(mig_reconciler(lib, inventory, journal_dir)), lib
