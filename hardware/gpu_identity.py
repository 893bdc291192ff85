"""Who a GPU was when it last answered, so a GPU that stops answering can still be named.

A GPU off the bus answers every NVML call, its handle included, with GPU_IS_LOST: the driver
still counts it but will not say its UUID or bus id. The node agent must keep serving the other
GPUs and publish the lost one as unhealthy under the ID pods and the kubelet already know, so
discovery names it from, in order:

1. this process's earlier answers (index -> UUID and bus id; indexes are stable while the driver
   stays loaded);
2. the PCI tree: NVML numbers GPUs in PCI bus order, so the k-th NVIDIA GPU function in sysfs that
   no reachable GPU claims is the k-th lost index (used only when the counts agree);
3. the identity file (bus id -> UUID, written atomically on every change), which outlives the
   process and a reboot: after a reboot with a GPU missing the indexes shift, the bus ids do not.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path

from devicemodel.inventory import LostGpu
from devicemodel.spec_derive import normalize_bus_id
from devicemodel.state_file import write_json_atomically
from hardware.discovery import GpuFacts
from hardware.sysfs import SysfsReader, nvml_bus_id

LOG = logging.getLogger(__name__)
IDENTITY_FILE = "gpu-identities.json"


class GpuIdentities:
    """Remembered GPU identities; ``path`` None keeps them in memory only."""

    def __init__(self, path: Path | None = None) -> None:
        self._path = path
        self._by_index: dict[int, tuple[str, str]] = {}  # index -> (uuid, bus id)
        self._uuid_by_bus: dict[str, str] = _load(path) if path is not None else {}

    def remember(self, gpus: Iterable[GpuFacts]) -> None:
        """Record the GPUs that answered; the file is rewritten only when something changed."""
        changed = False
        for gpu in gpus:
            self._by_index[gpu.index] = (gpu.uuid, gpu.pci_bus_id)
            if self._uuid_by_bus.get(gpu.pci_bus_id) != gpu.uuid:
                self._uuid_by_bus[gpu.pci_bus_id] = gpu.uuid
                changed = True
        if changed and self._path is not None:
            try:
                write_json_atomically(self._path, {"uuidByBusId": dict(sorted(self._uuid_by_bus.items()))})
            except OSError as exc:
                LOG.warning(
                    "cannot write GPU identities to %s (%s); a lost GPU may go unnamed",
                    self._path, exc
                )

    def name_lost(
        self, lost: Sequence[tuple[int, str]], *, reached: Iterable[GpuFacts], sysfs: SysfsReader
    ) -> tuple[LostGpu, ...]:
        """``lost``: (index, reason) of each GPU that did not answer; returns them named as well as
        the sources allow (empty UUID or bus id when none does)."""
        from_tree = _unclaimed_by_position([i for i, _ in lost], reached=reached, sysfs=sysfs)
        named = []
        for index, reason in lost:
            uuid, bus_id = self._by_index.get(index, ("", ""))
            bus_id = bus_id or from_tree.get(index, "")
            uuid = uuid or self._uuid_by_bus.get(bus_id, "")
            named.append(LostGpu(index=index, uuid=uuid, pci_bus_id=bus_id, reason=reason))
        return tuple(named)


def _unclaimed_by_position(
    indexes: Sequence[int], *, reached: Iterable[GpuFacts], sysfs: SysfsReader
) -> dict[int, str]:
    claimed = {g.pci_bus_id for g in reached}
    unclaimed = [nvml_bus_id(b) for b in sysfs.nvidia_gpus() if nvml_bus_id(b) not in claimed]
    if len(unclaimed) != len(indexes):
        LOG.warning(
            "%d GPU(s) do not answer but the PCI tree holds %d unclaimed NVIDIA GPU(s) (%s); "
            "naming them from remembered identities only",
            len(indexes), len(unclaimed), ", ".join(unclaimed) or "none",
        )
        return {}
    return dict(zip(sorted(indexes), unclaimed, strict=True))


def _load(path: Path) -> dict[str, str]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        LOG.warning("ignoring unreadable GPU identity file %s (%s)", path, exc)
        return {}
    table = data.get("uuidByBusId") if isinstance(data, dict) else None
    if not isinstance(table, dict):
        LOG.warning("ignoring GPU identity file %s: no uuidByBusId mapping", path)
        return {}
    return {
        normalize_bus_id(str(bus)): str(uuid)
        for bus, uuid in table.items()
        if isinstance(uuid, str) and uuid.startswith("GPU-")
    }
