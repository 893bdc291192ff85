"""Read the PCIe tree, NUMA nodes and RDMA/EFA adapters from sysfs, under a configurable root.

sysfs is the only place that says which PCIe switch and host bridge a device hangs off: the
realpath of ``/sys/bus/pci/devices/<bdf>`` walks from the host bridge (``pci0000:48``) through the
root port and each switch's upstream and downstream ports to the device. EFA adapters are found
by PCI vendor ``0x1d0f`` and device id ``0xefa*`` (never by name: rdma-core renames them), paired
with their ``/dev/infiniband/uverbsN`` through ``/sys/class/infiniband_verbs/uverbsN/ibdev``.
The root is a parameter so tests and the simulator read a fake tree with the same code.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

EFA_VENDOR = 0x1D0F
EFA_DEVICE_IDS = frozenset({0xEFA0, 0xEFA1, 0xEFA2, 0xEFA3})
NVIDIA_VENDOR = 0x10DE
_DISPLAY_CLASS = 0x03  # VGA 0x0300, 3D controller 0x0302
_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_NODE_DIR = re.compile(r"^node(\d+)$")


def sysfs_bdf(nvml_bus_id: str) -> str:
    """``00000000:53:00.0`` (NVML) -> ``0000:53:00.0`` (sysfs)."""
    domain, bus, rest = nvml_bus_id.lower().split(":")
    return f"{int(domain, 16):04x}:{bus}:{rest}"


def nvml_bus_id(bdf: str) -> str:
    """``0000:53:00.0`` (sysfs) -> ``00000000:53:00.0`` (NVML form, upper-case hex)."""
    domain, bus, rest = bdf.split(":")
    return f"{int(domain, 16):08X}:{bus.upper()}:{rest.upper()}"


@dataclass(frozen=True)
class PciDevice:
    bdf: str
    vendor: int
    device: int
    pci_class: int
    numa_node: int  # as sysfs says; -1 when the platform does not tell
    path: tuple[str, ...]  # host bridge, bridges..., the device (names under /sys/devices)

    @property
    def root(self) -> str:
        return self.path[0]

    @property
    def bridges(self) -> tuple[str, ...]:
        return tuple(p for p in self.path[1:-1] if _BDF.match(p))

    @property
    def root_port(self) -> str | None:
        """The root port the device's PCIe path leaves the host bridge by (None: on the bridge)."""
        bridges = self.bridges
        return bridges[0] if bridges else None

    @property
    def switch_upstream_port(self) -> str | None:
        """The upstream port of the nearest PCIe switch above the device, if any.

        Above a device behind a switch sit: root port, upstream port, downstream port. Fewer than
        three bridges means the device sits on a root port.
        """
        bridges = self.bridges
        return bridges[-2] if len(bridges) >= 3 else None


@dataclass(frozen=True)
class RdmaDevice:
    """An adapter under ``/sys/class/infiniband`` (EFA, InfiniBand or RoCE)."""

    name: str  # rdmap79s0, mlx5_0
    bdf: str
    vendor: int
    device: int
    link_layer: str  # "InfiniBand" / "Ethernet" / "" when unknown
    uverbs: str | None  # /dev/infiniband/uverbsN
    netdev: str | None

    @property
    def is_efa(self) -> bool:
        return self.vendor == EFA_VENDOR and self.device in EFA_DEVICE_IDS


@dataclass(frozen=True)
class NetInterface:
    name: str
    bdf: str | None  # PCI function behind it; None for virtual interfaces
    operstate: str


class SysfsReader:
    """Reads sysfs below ``root`` (``/`` on a real host); missing files read as absent, not errors."""

    def __init__(self, root: Path | str = Path("/")) -> None:
        self.root = Path(root)
        self._sys = self.root / "sys"

    # -- PCI -----------------------------------------------------------------------------------

    def pci_device(self, bdf: str) -> PciDevice | None:
        link = self._sys / "bus" / "pci" / "devices" / bdf
        if not link.exists():
            return None
        real = link.resolve()
        try:
            path = real.relative_to((self._sys / "devices").resolve()).parts
        except ValueError:
            path = (real.parent.name, real.name)
        return PciDevice(
            bdf=bdf,
            vendor=self._hex(real / "vendor"),
            device=self._hex(real / "device"),
            pci_class=self._hex(real / "class"),
            numa_node=self._int(real / "numa_node", default=-1),
            path=tuple(path),
        )

    def pci_devices(self) -> tuple[str, ...]:
        directory = self._sys / "bus" / "pci" / "devices"
        return tuple(sorted(p.name for p in directory.iterdir())) if directory.is_dir() else ()

    def nvidia_gpus(self) -> tuple[str, ...]:
        """Bus ids (sysfs form) of NVIDIA display/3D functions, in bus order: the GPUs the PCI tree
        holds whether or not the driver can still reach them (a GPU off the bus keeps its entry)."""
        found = []
        for bdf in self.pci_devices():
            device = self.pci_device(bdf)
            if device is None or device.vendor != NVIDIA_VENDOR:
                continue
            if device.pci_class >> 16 == _DISPLAY_CLASS:
                found.append(bdf)
        return tuple(found)

    # -- NUMA ----------------------------------------------------------------------------------

    def numa_nodes(self) -> tuple[int, ...]:
        directory = self._sys / "devices" / "system" / "node"
        if not directory.is_dir():
            return ()
        found = (_NODE_DIR.match(p.name) for p in directory.iterdir())
        return tuple(sorted(int(m.group(1)) for m in found if m))

    def numa_cpulist(self, node: int) -> str:
        return self._text(self._sys / "devices" / "system" / "node" / f"node{node}" / "cpulist")

    # -- RDMA and network ----------------------------------------------------------------------

    def rdma_devices(self) -> tuple[RdmaDevice, ...]:
        directory = self._sys / "class" / "infiniband"
        if not directory.is_dir():
            return ()
        uverbs = self._uverbs_by_ibdev()
        found: list[RdmaDevice] = []
        for entry in sorted(directory.iterdir()):
            device = entry / "device"
            if not device.exists():
                continue
            real = device.resolve()
            found.append(
                RdmaDevice(
                    name=entry.name,
                    bdf=real.name,
                    vendor=self._hex(real / "vendor"),
                    device=self._hex(real / "device"),
                    link_layer=self._text(entry / "ports" / "1" / "link_layer"),
                    uverbs=uverbs.get(entry.name),
                    netdev=self._first_netdev(real),
                )
            )
        return tuple(found)

    def efa_devices(self) -> tuple[RdmaDevice, ...]:
        return tuple(d for d in self.rdma_devices() if d.is_efa)

    def net_interfaces(self) -> tuple[NetInterface, ...]:
        directory = self._sys / "class" / "net"
        if not directory.is_dir():
            return ()
        found = []
        for entry in sorted(directory.iterdir()):
            real = entry.resolve()
            bdf = next((p for p in reversed(real.parts) if _BDF.match(p)), None)
            found.append(NetInterface(entry.name, bdf, self._text(real / "operstate") or "unknown"))
        return tuple(found)

    def operstate(self, interface: str) -> str | None:
        path = self._sys / "class" / "net" / interface / "operstate"
        return self._text(path) or None if path.exists() else None

    # -- helpers -------------------------------------------------------------------------------

    def _uverbs_by_ibdev(self) -> dict[str, str]:
        directory = self._sys / "class" / "infiniband_verbs"
        if not directory.is_dir():
            return {}
        found: dict[str, str] = {}
        for entry in sorted(directory.iterdir()):
            ibdev = self._text(entry / "ibdev")
            if entry.name.startswith("uverbs") and ibdev:
                found[ibdev] = f"/dev/infiniband/{entry.name}"
        return found

    def _first_netdev(self, device_dir: Path) -> str | None:
        net = device_dir / "net"
        names = sorted(p.name for p in net.iterdir()) if net.is_dir() else []
        return names[0] if names else None

    @staticmethod
    def _text(path: Path) -> str:
        try:
            return path.read_text(encoding="utf-8").strip()
        except OSError:
            return ""

    def _hex(self, path: Path) -> int:
        text = self._text(path)
        try:
            return int(text, 16) if text else 0
        except ValueError:
            return 0

    def _int(self, path: Path, *, default: int) -> int:
        text = self._text(path)
        try:
            return int(text) if text else default
        except ValueError:
            return default


def read_hw_counters(ibdev_dir: Path) -> dict[str, int]:
    """An RDMA adapter's hardware counters: port 1's (``ports/1/hw_counters``: traffic, RDMA and SRD
    errors) and the device's (``hw_counters``: admin queue, keep-alives), by file name; unreadable
    or non-numeric files are left out (counters differ by kernel and Nitro version)."""
    found: dict[str, int] = {}
    for directory in (ibdev_dir / "ports" / "1" / "hw_counters", ibdev_dir / "hw_counters"):
        for entry in sorted(directory.iterdir()) if directory.is_dir() else []:
            try:
                found[entry.name] = int(entry.read_text(encoding="utf-8").strip())
            except (OSError, ValueError):
                continue
    return found
