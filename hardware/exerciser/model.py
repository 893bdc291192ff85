"""What a healthy GPU of each model should deliver: the expectations active checks are judged by.

Figures are the vendors' published specifications (SM count, boost clock, NVLink generation),
per direction for links: an NVLink lane (one link) carries 25 GB/s per direction from NVLink 2
(Volta) to NVLink 4 (Hopper) and 50 GB/s on NVLink 5 (Blackwell); a PCIe lane carries its
generation's rate after line encoding. Integer multiply-add runs at 64 lanes per SM per clock on
every architecture from Volta on (CUDA C++ Programming Guide, arithmetic instruction throughput).
A product not in the table falls back to its architecture's figures. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from devicemodel.inventory import Architecture, NodeInventory
from hardware.exerciser.protocol import PeerPair

INT32_MAD_PER_SM_CLOCK = 64
MAD_PER_ITERATION = 8  # the compute kernel's loop body (hardware.exerciser.ptx)
# PCIe payload rate per lane and direction, GB/s, after 8b/10b (gen 1-2) or 128b/130b (gen 3-5)
# encoding; gen 6 (FLIT mode) at its nominal 64 GT/s with 242/256 FLIT efficiency.
PCIE_LANE_GBPS: Mapping[int, float] = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}


@dataclass(frozen=True)
class GpuModel:
    name: str
    sms: int
    boost_mhz: int
    nvlink_lane_gbps: float  # per direction
    memory_gbps: float  # device memory bandwidth

    @property
    def mad_per_s(self) -> float:
        """32-bit integer multiply-adds per second at the boost clock."""
        return self.sms * INT32_MAD_PER_SM_CLOCK * self.boost_mhz * 1e6


# Matched in order against the NVML product name: a more specific name comes first.
MODELS: tuple[tuple[str, GpuModel], ...] = (
    ("GB200", GpuModel("GB200", 148, 1965, 50.0, 8000.0)),
    ("B200", GpuModel("B200", 148, 1965, 50.0, 8000.0)),
    ("H200", GpuModel("H200", 132, 1980, 25.0, 4800.0)),
    ("H100 PCIe", GpuModel("H100 PCIe", 114, 1755, 25.0, 2000.0)),
    ("H100 NVL", GpuModel("H100 NVL", 132, 1785, 25.0, 3900.0)),
    ("H100", GpuModel("H100 SXM", 132, 1980, 25.0, 3350.0)),
    ("L40S", GpuModel("L40S", 142, 2520, 0.0, 864.0)),
    ("A100-SXM4-80GB", GpuModel("A100 SXM4 80GB", 108, 1410, 25.0, 2039.0)),
    ("A100 80GB PCIe", GpuModel("A100 PCIe 80GB", 108, 1410, 25.0, 1935.0)),
    ("A100", GpuModel("A100", 108, 1410, 25.0, 1555.0)),
    ("V100-SXM2", GpuModel("V100 SXM2", 80, 1530, 25.0, 900.0)),
    ("V100", GpuModel("V100", 80, 1380, 25.0, 900.0)),
)
BY_ARCHITECTURE: Mapping[Architecture, GpuModel] = {
    Architecture.VOLTA: GpuModel("volta", 80, 1380, 25.0, 900.0),
    Architecture.TURING: GpuModel("turing", 40, 1590, 0.0, 320.0),
    Architecture.AMPERE: GpuModel("ampere", 108, 1410, 25.0, 1555.0),
    Architecture.ADA: GpuModel("ada", 142, 2520, 0.0, 864.0),
    Architecture.HOPPER: GpuModel("hopper", 132, 1980, 25.0, 3350.0),
    Architecture.BLACKWELL: GpuModel("blackwell", 148, 1965, 50.0, 8000.0),
}
UNKNOWN_MODEL = GpuModel("unknown", 80, 1380, 25.0, 900.0)  # the oldest supported: slowest bounds


def model_for(product: str, architecture: Architecture) -> GpuModel:
    for needle, model in MODELS:
        if needle in product:
            return model
    return BY_ARCHITECTURE.get(architecture, UNKNOWN_MODEL)


def pcie_gbps(generation: int, width: int) -> float | None:
    """The link's payload rate per direction, or None for a generation not in the table."""
    lane = PCIE_LANE_GBPS.get(generation)
    return None if lane is None or width <= 0 else lane * width


@dataclass(frozen=True)
class Expectations:
    """Per GPU UUID: its model, its PCIe link's rate; per peer pair: the pair's NVLink rate."""

    models: Mapping[str, GpuModel]
    pcie: Mapping[str, float | None]  # GB/s per direction at the link's maximum generation and width
    pcie_link: Mapping[str, tuple[int, int] | None]  # (generation, width) the rate comes from

    def model(self, uuid: str) -> GpuModel:
        return self.models.get(uuid, UNKNOWN_MODEL)

    def peer_gbps(self, pair: PeerPair) -> float:
        return pair.lanes * self.model(pair.src).nvlink_lane_gbps

    def compute_seconds(self, uuid: str, *, threads: int, iterations: int) -> float:
        return threads * iterations * MAD_PER_ITERATION / self.model(uuid).mad_per_s


def expectations(inventory: NodeInventory, links: Mapping[str, tuple[int, int] | None]) -> Expectations:
    """Expectations for ``inventory``'s GPUs; ``links``: GPU UUID -> the PCIe link's maximum
    (generation, width) as NVML reads it (``nvmlDeviceGetMaxPcieLinkGeneration``/``Width``), the
    rate the link must reach under load (idle links drop their generation to save power)."""
    models = {g.uuid: model_for(g.product, g.architecture) for g in inventory.gpus}
    rates = {uuid: (None if link is None else pcie_gbps(*link)) for uuid, link in links.items()}
    return Expectations(models, rates, dict(links))
