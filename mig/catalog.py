"""The MIG profile catalog, as the MIG manager sees it.

The tables live in ``topology.mig_catalog`` (the pure bottom layer) because the simulated
hardware, which sits below ``mig/``, implements NVML's MIG calls from the same facts; this module
is the name the rest of ``mig/`` and its users import.
"""

from __future__ import annotations

from topology.mig_catalog import (
    GiProfile,
    GpuModel,
    MigCatalog,
    MigCatalogError,
    Placement,
    default_catalog,
)

__all__ = ["GiProfile", "GpuModel", "MigCatalog", "MigCatalogError", "Placement", "default_catalog"]
