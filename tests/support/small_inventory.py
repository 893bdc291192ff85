"""A small hand-built node for device-plugin tests: 4 GPUs on 2 NUMA nodes, NVLink pairs, 2 EFAs."""

from __future__ import annotations

from devicemodel.inventory import (
    Architecture,
    Gpu,
    MigDevice,
    Nic,
    NicType,
    NodeInventory,
    NvLink,
    PcieSwitch,
)


def gpu_uuid(index: int) -> str:
    return f"GPU-00000000-0000-4000-8000-{index:012d}"


def small_inventory(*, mig_on: tuple[int, ...] = (), gpus: int = 4, name: str = "node-a") -> NodeInventory:
    switches = (PcieSwitch("sw0", 0, "pci0000:00"), PcieSwitch("sw1", 1, "pci0000:80"))
    gpu_list = tuple(
        Gpu(
            index=i,
            uuid=gpu_uuid(i),
            pci_bus_id=f"00000000:{0x10 + i:02x}:00.0",
            product="NVIDIA A100-SXM4-80GB",
            architecture=Architecture.AMPERE,
            compute_capability="8.0",
            memory_mib=81920,
            numa_node=i * 2 // gpus,
            pcie_switch=f"sw{i * 2 // gpus}",
            pcie_root="pci0000:00" if i * 2 < gpus else "pci0000:80",
            minor=i,
            mig_capable=True,
            mig_enabled=i in mig_on,
        )
        for i in range(gpus)
    )
    migs = tuple(
        MigDevice(
            uuid=f"MIG-00000000-0000-4000-8000-{i:06d}{k:06d}",
            parent_uuid=gpu_uuid(i),
            parent_index=i,
            profile="3g.40gb",
            gpu_instance_id=k + 1,
            compute_instance_id=0,
            placement_start=4 * k,
            placement_size=4,
            memory_mib=40192,
            compute_slices=3,
        )
        for i in mig_on
        for k in range(2)
    )
    nics = tuple(
        Nic(
            name=f"rdmap{16 + n}s0",
            type=NicType.EFA,
            pci_bus_id=f"00000000:{0x20 + n:02x}:00.0",
            numa_node=n,
            pcie_switch=f"sw{n}",
            pcie_root="pci0000:00" if n == 0 else "pci0000:80",
            uverbs_device=f"/dev/infiniband/uverbs{n}",
        )
        for n in range(2)
    )
    nvlinks = tuple(NvLink(a, a + 1, 12) for a in range(0, gpus - 1, 2))
    return NodeInventory(
        name=name,
        numa_nodes=2,
        gpus=gpu_list,
        pcie_switches=switches,
        nvlinks=nvlinks,
        nics=nics,
        mig_devices=migs,
        driver_version="550.54.15",
        cuda_driver_version="12.4",
    )
