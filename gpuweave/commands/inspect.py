"""`gpuweave inspect`: print a node's GPU inventory and topology matrix.

With ``--simulate PROFILE|FILE`` the inventory comes from a simulated node (the production NVML
and sysfs readers over the fake library and tree); without it, from this host's GPUs through
NVML. ``--json`` prints the inventory as a NodeProfile document (usable as a profile file: ``jq
.profile``), the topology matrix and the CPUs of each NUMA node.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from devicemodel.inventory import NodeInventory
from devicemodel.spec import NodeProfile
from hardware.backend import DriverNotLoadedError
from hardware.nvml import NvmlBackend
from hardware.profiles import builtin_profile_names, load_profile
from hardware.simulated.backend import SimulatedBackend
from hardware.sysfs import SysfsReader
from topology.graph import TopologyGraph


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "inspect",
        help="print a node's GPU inventory and topology matrix",
        description=(
            "Print the GPUs, MIG devices, NICs and the topology matrix (as `nvidia-smi topo -m`) of this "
            "host, or of a simulated node with --simulate. Built-in profiles: "
            + ", ".join(builtin_profile_names())
        ),
    )
    add = parser.add_argument
    add("--simulate", metavar="PROFILE|FILE", help="a built-in profile name or a profile YAML file")
    add("--node-name", default=None, help="name of the simulated node (default: the profile's name)")
    add("--json", action="store_true", help="print JSON for machines instead of tables")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    inventory, cpus = discover(args.simulate, node_name=args.node_name)
    matrix = TopologyGraph.from_inventory(inventory).matrix()
    if args.json:
        document = {
            "profile": NodeProfile.from_inventory(inventory).to_wire(),
            "topology": matrix.to_dict(),
            "numaCpus": {str(node): cpulist for node, cpulist in cpus.items()},
        }
        print(json.dumps(document, indent=2))
        return 0
    print(render_inventory(inventory, cpus))
    print()
    print(matrix.to_text())
    return 0


def discover(simulate: str | None, *, node_name: str | None) -> tuple[NodeInventory, dict[int, str]]:
    """The inventory and each NUMA node's CPU list, from a simulated node or this host."""
    if simulate:
        simulated = SimulatedBackend(load_profile(simulate), node_name=node_name)
        backend: SimulatedBackend | NvmlBackend = simulated
        sysfs = SysfsReader(simulated.sysfs_root)
    else:
        backend = NvmlBackend(node_name=node_name)
        sysfs = backend.sysfs
    try:
        inventory = backend.discover()
        return inventory, {node: sysfs.numa_cpulist(node) for node in range(inventory.numa_nodes)}
    except DriverNotLoadedError as exc:
        raise DriverNotLoadedError(f"{exc}; or inspect a simulated node: --simulate PROFILE|FILE") from None
    finally:
        backend.close()


def render_inventory(inventory: NodeInventory, cpus: dict[int, str]) -> str:
    versions = f"driver {inventory.driver_version or '?'}, CUDA {inventory.cuda_driver_version or '?'}"
    lines = [
        f"Node {inventory.name}: {len(inventory.gpus)} GPUs, {len(inventory.nics)} NICs, "
        f"{inventory.numa_nodes} NUMA nodes, {len(inventory.pcie_switches)} PCIe switches; {versions}",
        _interconnect(inventory),
        "",
        _table(
            ("GPU", "UUID", "Product", "Memory", "NUMA", "PCIe switch", "Bus ID", "MIG"),
            [
                (str(g.index), g.uuid, g.product, f"{g.memory_mib} MiB", str(g.numa_node),
                 g.pcie_switch or f"({g.pcie_root})", g.pci_bus_id,
                 "enabled" if g.mig_enabled else "capable" if g.mig_capable else "-")
                for g in inventory.gpus
            ],
        ),
    ]
    if inventory.mig_devices:
        lines += ["", _table(
            ("GPU", "MIG device", "Profile", "GI", "CI", "Slots", "Memory"),
            [(str(m.parent_index), m.uuid, m.profile, str(m.gpu_instance_id), str(m.compute_instance_id),
              f"{m.placement_start}-{m.placement_start + m.placement_size - 1}", f"{m.memory_mib} MiB")
             for m in inventory.mig_devices],
        )]
    if inventory.nics:
        lines += ["", _table(
            ("NIC", "Type", "Bus ID", "NUMA", "PCIe switch", "Verbs device", "Netdev"),
            [(n.name, n.type.value, n.pci_bus_id, str(n.numa_node), n.pcie_switch or f"({n.pcie_root})",
              n.uverbs_device or "-", n.netdev or "-") for n in inventory.nics],
        )]
    if any(cpus.values()):
        lines += ["", "CPU affinity: " + "; ".join(f"NUMA {n}: CPUs {c}" for n, c in cpus.items() if c)]
    return "\n".join(lines)


def _interconnect(inventory: NodeInventory) -> str:
    parts = []
    if inventory.nvswitch is not None:
        gpus = ",".join(map(str, inventory.nvswitch.gpus))
        fabric = inventory.nvswitch
        line = f"NVSwitch fabric: GPUs {gpus}, {fabric.links_per_gpu} NVLinks each"
        if fabric.clique is not None:
            line += f"; multi-node NVLink domain {fabric.cluster_uuid}, clique {fabric.clique_id}"
        parts.append(line)
    if inventory.nvlinks:
        pairs = " ".join(f"{nl.gpu_a}-{nl.gpu_b}x{nl.links}" for nl in inventory.nvlinks)
        parts.append(f"NVLink pairs: {pairs}")
    return "; ".join(parts) if parts else "No NVLink: GPUs talk over PCIe"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    )
