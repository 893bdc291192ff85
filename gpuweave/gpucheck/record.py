"""Write a host's NVML recording as a fixture, and replay a fixture against the simulator.

``record_fixture`` is the last step of ``gpuweave gpu-check`` (``scripts/gpu-check``): it records
every NVML answer the product reads on this host (or on a simulated profile) together with what
the replay needs to rebuild the same machine in the simulator: the built-in profile that describes
it and its MIG layout. ``recordedBy`` names the check as ``scripts/gpu-check`` whichever entry form
ran it, so a fixture does not depend on how the check was started. ``replay`` builds that
simulated machine, records it the same way and returns every difference
(``hardware.nvml_fixture.compare``).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from devicemodel.inventory import NodeInventory
from hardware.mig_catalog import default_catalog
from hardware.mig_ops import MigOps
from hardware.nvml import NvmlBackend
from hardware.nvml_fixture import FixtureError, compare, dump, fixture_name, load
from hardware.nvml_record import NvmlRecorder
from hardware.profiles import builtin_profile_names, load_profile
from hardware.simulated.backend import SimulatedBackend


def record_fixture(*, simulate: str | None, out_dir: Path, profile: str | None = None) -> Path:
    """Record this host (or the simulated ``simulate`` profile) into ``out_dir``; the file written."""
    backend: SimulatedBackend | NvmlBackend = (
        SimulatedBackend(load_profile(simulate)) if simulate else NvmlBackend()
    )
    try:
        nvml = backend.nvml if isinstance(backend, SimulatedBackend) else backend
        inventory = backend.discover()
        entries = NvmlRecorder(nvml.caller).record()
        layout = _mig_layout(MigOps(nvml.lib, call=nvml.caller), inventory)
    finally:
        backend.close()
    if not inventory.gpus:
        raise FixtureError("no GPU answered NVML; nothing to record")
    product, driver = inventory.gpus[0].product, inventory.driver_version
    meta = {
        "recordedBy": "scripts/gpu-check" + (f" --simulate {simulate}" if simulate else ""),
        "source": "simulated" if simulate else "nvml",
        "profile": simulate or profile or _matching_profile(inventory),
        "product": product,
        "driver": driver,
        "gpuCount": len(inventory.gpus),
        "mig": layout,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / fixture_name(product, driver)
    _write_atomically(target, dump(meta, entries))
    return target


def _mig_layout(ops: MigOps, inventory: NodeInventory) -> dict[str, list[dict[str, int]]]:
    """GPU index -> its GPU instances (profile ID, placement start), for MIG-enabled GPUs only."""
    return {
        str(gpu.index): [{"profileId": r.profile_id, "start": r.start} for r in ops.instances(gpu.index)]
        for gpu in inventory.gpus
        if gpu.mig_enabled
    }


def _matching_profile(inventory: NodeInventory) -> str | None:
    """The first built-in profile with the same GPU product and count (None: add one, or --profile)."""
    for name in builtin_profile_names():
        gpus = load_profile(name).to_inventory().gpus
        if len(gpus) == len(inventory.gpus) and gpus[0].product == inventory.gpus[0].product:
            return name
    return None


def _write_atomically(target: Path, text: str) -> None:
    handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    with os.fdopen(handle, "w") as stream:
        stream.write(text)
    os.chmod(temporary, 0o644)  # a file to commit, readable like the rest of the tree
    os.replace(temporary, target)


def replay(path: Path) -> list[str]:
    """Every difference between a fixture and the simulator configured as the same machine."""
    meta, expected = load(path)
    profile = meta.get("profile")
    if not isinstance(profile, str):
        raise FixtureError(
            f"{path}: no built-in profile describes {meta.get('product')} x{meta.get('gpuCount')}; add one "
            "(docs/node-profiles.md) and re-record with gpuweave gpu-check --profile NAME"
        )
    backend = SimulatedBackend(load_profile(profile))
    try:
        backend.discover()
        _build_mig_layout(backend, meta.get("mig") or {})
        backend.discover()
        actual = NvmlRecorder(backend.nvml.caller).record()
    finally:
        backend.close()
    return compare(expected, actual)


def _build_mig_layout(backend: SimulatedBackend, layout: dict[str, Any]) -> None:
    """MIG on and the recorded GPU instances (one full-size compute instance each) on the simulator."""
    ops = MigOps(backend.lib, call=backend.nvml.caller)
    for key, instances in layout.items():
        gpu = backend.inventory.gpu(int(key))
        ops.set_mig_mode(gpu.index, enabled=True)
        backend.node.mig.reset(gpu.pci_bus_id)  # Ampere applies the pending mode at a reset
        model = default_catalog().for_product(gpu.product)
        for instance in instances:
            profile = model.profile_by_id(int(instance["profileId"]))
            ops.create(
                gpu.index,
                profile_id=profile.profile_id,
                start=int(instance["start"]),
                size=profile.memory_slices,
                ci_profile_index=profile.ci_profile_index,
            )
