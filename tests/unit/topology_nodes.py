"""Small node inventories for the topology tests, built straight from the inventory dataclasses.

Each mirrors a real machine's interconnect closely enough for the placement questions the tests
ask; see docs/topology.md for the DGX-1 V100 cube-mesh layout derived here.
"""

from __future__ import annotations

from devicemodel.inventory import (
    Architecture,
    Gpu,
    Nic,
    NicType,
    NodeInventory,
    NvLink,
    NvSwitchFabric,
    PcieSwitch,
)

# DGX-1 with V100 (hybrid cube-mesh), as `nvidia-smi topo -m` prints it on that machine:
#        GPU0 GPU1 GPU2 GPU3 GPU4 GPU5 GPU6 GPU7
#  GPU0   X   NV1  NV1  NV2  NV2  SYS  SYS  SYS
#  GPU1  NV1   X   NV2  NV1  SYS  NV2  SYS  SYS
#  GPU2  NV1  NV2   X   NV2  SYS  SYS  NV1  SYS
#  GPU3  NV2  NV1  NV2   X   SYS  SYS  SYS  NV1
#  GPU4  NV2  SYS  SYS  SYS   X   NV1  NV1  NV2
#  GPU5  SYS  NV2  SYS  SYS  NV1   X   NV2  NV1
#  GPU6  SYS  SYS  NV1  SYS  NV1  NV2   X   NV2
#  GPU7  SYS  SYS  SYS  NV1  NV2  NV1  NV2   X
# Every GPU has six lanes; quads {0,1,2,3} and {4,5,6,7} are fully linked; i <-> i+4 links join
# the quads (double for 0-4 and 1-5, single for 2-6 and 3-7).
DGX1_V100_NVLINKS = (
    (0, 1, 1), (0, 2, 1), (0, 3, 2), (0, 4, 2),
    (1, 2, 2), (1, 3, 1), (1, 5, 2),
    (2, 3, 2), (2, 6, 1),
    (3, 7, 1),
    (4, 5, 1), (4, 6, 1), (4, 7, 2),
    (5, 6, 2), (5, 7, 1),
    (6, 7, 2),
)


def make_gpu(index: int, *, architecture: Architecture = Architecture.HOPPER, numa_node: int = 0,
             switch: str | None = None, root: str = "pci0000:00", uuid_seed: str = "0") -> Gpu:
    return Gpu(
        index=index,
        uuid=f"GPU-{uuid_seed:0>8}-0000-4000-8000-{index:012d}",
        pci_bus_id=f"00000000:{0x10 + index:02X}:00.0",
        product=f"test {architecture.value} GPU",
        architecture=architecture,
        compute_capability="9.0",
        memory_mib=81920,
        numa_node=numa_node,
        pcie_switch=switch,
        pcie_root=root,
        minor=index,
    )


def make_nic(name: str, *, numa_node: int, switch: str | None, root: str) -> Nic:
    return Nic(name=name, type=NicType.EFA, pci_bus_id=f"0000:{name}", numa_node=numa_node,
               pcie_switch=switch, pcie_root=root)


def switched_node(name: str, *, gpus_per_switch: int, switches: int, numa_nodes: int,
                  architecture: Architecture, nic_switches: tuple[int, ...] = (), uuid_seed: str = "0",
                  nvlinks: tuple[NvLink, ...] = (), nvswitch: NvSwitchFabric | None = None) -> NodeInventory:
    """GPUs over PCIe switches; a host bridge per two switches of a NUMA node; switches split over NUMA."""
    per_numa = switches // numa_nodes
    sw = [PcieSwitch(name=f"sw{s}", numa_node=s // per_numa,
                     root=f"pci{s // per_numa:04x}:{s % per_numa // 2:02x}")
          for s in range(switches)]
    gpus = tuple(
        make_gpu(s * gpus_per_switch + k, architecture=architecture, numa_node=sw[s].numa_node,
                 switch=sw[s].name, root=sw[s].root, uuid_seed=uuid_seed)
        for s in range(switches) for k in range(gpus_per_switch)
    )
    nics = tuple(make_nic(f"nic{s}", numa_node=sw[s].numa_node, switch=sw[s].name, root=sw[s].root)
                 for s in nic_switches)
    return NodeInventory(name=name, numa_nodes=numa_nodes, gpus=gpus, pcie_switches=tuple(sw),
                         nvlinks=nvlinks, nvswitch=nvswitch, nics=nics)


def dgx1_v100(*, uuid_seed: str = "0") -> NodeInventory:
    links = tuple(NvLink(a, b, n) for a, b, n in DGX1_V100_NVLINKS)
    return switched_node("dgx1-v100", gpus_per_switch=2, switches=4, numa_nodes=2,
                         architecture=Architecture.VOLTA, nic_switches=(0, 1, 2, 3), nvlinks=links,
                         uuid_seed=uuid_seed)


def nvswitch_node(*, gpus: int = 8, architecture: Architecture = Architecture.HOPPER, links: int = 18,
                  nic_switches: tuple[int, ...] | None = None, uuid_seed: str = "0") -> NodeInventory:
    """p5/DGX-H100-like: one GPU per PCIe switch, all GPUs on one NVSwitch fabric, two NUMA nodes."""
    fabric = NvSwitchFabric(gpus=tuple(range(gpus)), links_per_gpu=links)
    nic_on = tuple(range(gpus)) if nic_switches is None else nic_switches
    return switched_node(f"nvswitch-{gpus}", gpus_per_switch=1, switches=gpus, numa_nodes=2,
                         architecture=architecture, nic_switches=nic_on, nvswitch=fabric,
                         uuid_seed=uuid_seed)


def p4d() -> NodeInventory:
    """p4d.24xlarge-like: 8x A100 on NVSwitch (NV12), two GPUs and one EFA per PCIe switch."""
    fabric = NvSwitchFabric(gpus=tuple(range(8)), links_per_gpu=12)
    return switched_node("p4d", gpus_per_switch=2, switches=4, numa_nodes=2,
                         architecture=Architecture.AMPERE, nic_switches=(0, 1, 2, 3), nvswitch=fabric)


def pcie_only(*, architecture: Architecture = Architecture.ADA) -> NodeInventory:
    """l40s-pcie-8-like: no NVLink; two GPUs per switch, four switches, two NUMA nodes."""
    return switched_node("pcie-8", gpus_per_switch=2, switches=4, numa_nodes=2,
                         architecture=architecture, nic_switches=(0, 2))


def nvbridge_pairs() -> NodeInventory:
    """a100-pcie-nvbridge-4-like: NVLink bridges join GPUs 0-1 and 2-3 (NV12), one per NUMA node."""
    links = (NvLink(0, 1, 12), NvLink(2, 3, 12))
    return switched_node("nvbridge-4", gpus_per_switch=2, switches=2, numa_nodes=2,
                         architecture=Architecture.AMPERE, nvlinks=links)
