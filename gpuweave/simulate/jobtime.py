"""How long a training job runs on the GPUs it got: steps x (compute + communication).

A training job's pods run data-parallel steps: every GPU computes its share of the batch, then the
gradients are all-reduced in a ring over every GPU of the job. A ring runs at its slowest link, so
the job's step time is set by the worst link its placement gives it: inside a node the worst GPU
pair of its set (the topology graph's pair classes and bandwidths, ``topology.links``); between
nodes the network bandwidth of the slower node, reduced by how far up the network hierarchy the
nodes must go to reach each other (their lowest common tier, ``topology.network``), unless every
node is in one NVLink clique (one multi-node NVLink partition of an NVL72 rack, the
``nvidia.com/gpu.clique`` label): then the nodes reach each other over the rack's NVLink switch
trays, not the network, and the class is ``NVLINK_DOMAIN``.

``TrainingStep`` fixes the simulated workload (docs/simulate.md, "Job time", gives the sources and
why this split). A job's drawn duration is its run time on the best placement of its size (one
NVSwitch H100 node, or p5 nodes in one network block); any other placement stretches it by the
ratio of step times, so a job on a worse set takes longer and one on the best set takes exactly
its drawn time. Single-GPU and fractional jobs do not communicate and keep their duration.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType

from devicemodel.inventory import NicType
from gpuweave.simulate.fleet import FleetNode
from topology.links import LinkClass
from topology.network import (
    DEFAULT_TIER_LABELS,
    LABEL_AWS_LAYER_1,
    LABEL_AWS_LAYER_2,
    LABEL_GKE_BLOCK,
    LABEL_GPU_CLIQUE,
    lowest_common_tier,
)


class SlowestLink(StrEnum):
    """The class of a job's slowest link, best first."""

    LOCAL = "single-gpu"  # no communication
    NVLINK = "nvlink"  # NVLink or NVSwitch inside a node
    NVLINK_DOMAIN = "nvlink-domain"  # between nodes of one NVLink clique (NVL72 switch trays)
    PCIE_SWITCH = "pcie-switch"  # PIX/PXB: peer-to-peer under PCIe switches
    HOST_BRIDGE = "pcie-host-bridge"  # PHB/NODE: through a CPU's root complex
    CROSS_NUMA = "cross-numa"  # SYS: across the CPU sockets' interconnect
    NET_BLOCK = "network-block"  # between nodes of one network block (layer 3 / GKE sub-block)
    NET_LAYER2 = "network-layer-2"  # between blocks under one layer-2 switch group (GKE: one block)
    NET_SPINE = "network-spine"  # up to the top layer (layer 1) or beyond every labelled tier


_INTRA_CLASS = MappingProxyType(
    {
        LinkClass.NVLINK: SlowestLink.NVLINK,
        LinkClass.NVSWITCH: SlowestLink.NVLINK,
        LinkClass.PIX: SlowestLink.PCIE_SWITCH,
        LinkClass.PXB: SlowestLink.PCIE_SWITCH,
        LinkClass.PHB: SlowestLink.HOST_BRIDGE,
        LinkClass.NODE: SlowestLink.HOST_BRIDGE,
        LinkClass.SYS: SlowestLink.CROSS_NUMA,
    }
)
_TIER_CLASS = MappingProxyType(
    {
        LABEL_AWS_LAYER_2: SlowestLink.NET_LAYER2,
        LABEL_GKE_BLOCK: SlowestLink.NET_LAYER2,
        LABEL_AWS_LAYER_1: SlowestLink.NET_SPINE,
    }
)  # every other tier label (layer 3, GKE sub-block) is one block; one clique is NVLINK_DOMAIN

# Per-hop latency of a ring step, microseconds: NCCL's tuning model (src/graph/tuning.cc, hwLat,
# Ring algorithm, Simple protocol: NVLink 3.4, PCI 5.7, NET 14.0; baseLat 8.4 per call). The extra
# switch layers a message crosses above the block are a modelling assumption (not measured): +2 us
# per layer.
RING_HOP_LATENCY_US = MappingProxyType(
    {
        SlowestLink.LOCAL: 0.0,
        SlowestLink.NVLINK: 3.4,
        SlowestLink.NVLINK_DOMAIN: 3.4,  # NCCL prices a multi-node NVLink hop as an NVLink one
        SlowestLink.PCIE_SWITCH: 5.7,
        SlowestLink.HOST_BRIDGE: 5.7,
        SlowestLink.CROSS_NUMA: 5.7,
        SlowestLink.NET_BLOCK: 14.0,
        SlowestLink.NET_LAYER2: 16.0,
        SlowestLink.NET_SPINE: 18.0,
    }
)
# Share of a node's network bandwidth one job gets across the tier: a block is non-blocking; the
# layers above it are oversubscribed and shared with other traffic. Modelling assumption (not
# measured; AWS and GCP publish no oversubscription ratios): 0.7 one layer up, 0.5 at the spine
# (a 2:1 spine, a common fat-tree design point).
TIER_BANDWIDTH_FACTOR = MappingProxyType(
    {
        SlowestLink.NET_BLOCK: 1.0,
        SlowestLink.NET_LAYER2: 0.7,
        SlowestLink.NET_SPINE: 0.5,
    }
)
# Line rate per adapter, GB/s: EFA 100 Gbps (p4d.24xlarge 4 x 100 = 400 Gbps, p5.48xlarge 32 x 100
# = 3200 Gbps, AWS instance type pages); InfiniBand HDR 200 Gbps, NDR 400 Gbps (NVIDIA DGX A100 /
# H100 user guides), taken as HDR for an unknown part.
NIC_GBPS = MappingProxyType({NicType.EFA: 12.5, NicType.INFINIBAND: 25.0, NicType.ETHERNET: 3.125})
# Where the adapter type alone misprices a node (the inventory carries no link rate): a GB200 NVL72
# compute tray's four ConnectX-7 adapters run NDR InfiniBand, 400 Gbps = 50 GB/s each (its profile,
# hardware/builtin_profiles/gb200-compute-tray.yaml; NVIDIA GB200 NVL72 specifications).
NODE_NETWORK_GBPS = MappingProxyType({"gb200-compute-tray": 4 * 50.0})
RING_BASE_LATENCY_US = 8.4
REFERENCE_NVLINK_GBPS = 450.0  # H100 NVLink 4 through NVSwitch, one way (900 GB/s both ways)
REFERENCE_NETWORK_GBPS = 400.0  # p5.48xlarge, 3200 Gbps EFA
# Between the nodes of one NVLink clique, per GPU, one way: fifth-generation NVLink, 1.8 TB/s per
# GPU both ways = 900 GB/s one way, every GPU of the rack reaching every other through the NVLink
# switch trays (NVIDIA GB200 NVL72 specifications, nvidia.com/en-us/data-center/gb200-nvl72/:
# "NVLink Bandwidth 130 TB/s" for 72 GPUs, "fifth-generation NVLink ... 1.8 TB/s"; the GB300 NVL72
# the same). A ring over the domain runs at this or its worst pair inside a node, whichever is less.
NVLINK_DOMAIN_GBPS = 900.0


@dataclass(frozen=True)
class Ring:
    """An all-reduce ring over a job's GPUs: its slowest bandwidth and per-hop latencies."""

    gpus: int
    gbps: float
    intra_us: float  # a hop inside a node
    nodes: int = 1
    inter_us: float = 0.0  # a hop between nodes

    def latency_us(self) -> float:
        """NCCL's ring all-reduce latency (tuning.cc): base + (2(n-1) - 2 nodes) intra-node hops
        + 2 nodes network hops (no network hop for one node)."""
        steps = 2 * (self.gpus - 1)
        crossings = 2 * self.nodes if self.nodes > 1 else 0
        return RING_BASE_LATENCY_US + (steps - crossings) * self.intra_us + crossings * self.inter_us


@dataclass(frozen=True)
class TrainingStep:
    """One data-parallel step of the simulated training workload (docs/simulate.md, "Job time").

    A 2B-parameter model in bf16: 4 GB of gradients, all-reduced in PyTorch DDP's default 25 MB
    buckets; 0.9 s of compute per step (about 30k tokens per GPU at 40% of an H100's dense bf16
    rate). Compute is taken as equal on every GPU generation: the simulation compares placements,
    not hardware, so only the links differ.
    """

    compute_s: float = 0.9
    gradient_bytes: float = 4e9
    bucket_bytes: float = 25e6

    def comm_s(self, ring: Ring) -> float:
        """Ring all-reduce of the gradients: 2(n-1)/n of the bytes through the slowest link, and
        per bucket NCCL's ring latency: 2(n-1) steps, 2 per node crossing the network."""
        if ring.gpus < 2:
            return 0.0
        volume = 2 * (ring.gpus - 1) / ring.gpus * self.gradient_bytes / (ring.gbps * 1e9)
        buckets = math.ceil(self.gradient_bytes / self.bucket_bytes)
        return volume + buckets * ring.latency_us() * 1e-6

    def step_s(self, ring: Ring) -> float:
        return self.compute_s + self.comm_s(ring)


@dataclass(frozen=True)
class JobTiming:
    """What a placement gives a job: its slowest link and how much longer it runs than on the best."""

    slowest: SlowestLink
    gbps: float  # bandwidth of the slowest link, GB/s one way
    stretch: float  # run time / run time on the best placement of this size (>= 1)


def node_network_gbps(node: FleetNode) -> float:
    """A node's network line rate for gang traffic (its EFA adapters, else its InfiniBand ones)."""
    if node.profile in NODE_NETWORK_GBPS:
        return NODE_NETWORK_GBPS[node.profile]
    for kind in (NicType.EFA, NicType.INFINIBAND):
        count = sum(1 for nic in node.inventory.nics if nic.type is kind)
        if count:
            return count * NIC_GBPS[kind]
    return NIC_GBPS[NicType.ETHERNET]


def _intra_node(
    node: FleetNode, gpus: Sequence[int], slow: Mapping[frozenset[int], float]
) -> tuple[SlowestLink, float]:
    """The worst GPU pair of the set: its class and modelled bandwidth (``topology.links``); a
    pair in ``slow`` runs at its share of that (a slow NVLink pair keeps its class)."""
    worst: tuple[SlowestLink, float] = (SlowestLink.LOCAL, math.inf)
    for i, a in enumerate(gpus):
        for b in gpus[i + 1 :]:
            gbps = node.graph.pair_bandwidth(a, b) * slow.get(frozenset((a, b)), 1.0)
            if gbps < worst[1]:
                worst = (_INTRA_CLASS[node.graph.pair_link(a, b).link_class], gbps)
    return worst


def one_clique(labels: Sequence[Mapping[str, str]]) -> bool:
    """Whether every node carries the same NVLink clique label (one multi-node NVLink partition)."""
    cliques = {node.get(LABEL_GPU_CLIQUE) for node in labels}
    return len(cliques) == 1 and None not in cliques


def network_class(labels: Sequence[Mapping[str, str]], *, tier_labels: Sequence[str]) -> SlowestLink:
    """Which network level the nodes meet at, from their lowest common tier label (nodes of one
    NVLink clique meet over NVLink, not the network: ``NVLINK_DOMAIN``)."""
    if one_clique(labels):
        return SlowestLink.NVLINK_DOMAIN
    tier = lowest_common_tier(labels, tier_labels=tier_labels)
    if tier >= len(tier_labels):
        return SlowestLink.NET_SPINE
    return _TIER_CLASS.get(tier_labels[tier], SlowestLink.NET_BLOCK)


def job_timing(
    members: Sequence[tuple[FleetNode, Sequence[int]]],
    *,
    step: TrainingStep | None = None,
    tier_labels: Sequence[str] = DEFAULT_TIER_LABELS,
    slow_pairs: Mapping[str, Mapping[frozenset[int], float]] | None = None,
) -> JobTiming:
    """The timing of a job whose pods run on ``members`` (node, its GPU indices). ``slow_pairs``:
    per node name, GPU pairs whose link runs at a share of its modelled bandwidth (a slow NVLink
    pair, half its lanes: ``latent``), whoever placed the job there."""
    step = step or TrainingStep()
    gpus = sum(len(g) for _, g in members)
    if gpus < 2:
        return JobTiming(SlowestLink.LOCAL, math.inf, 1.0)
    slow = slow_pairs or {}
    intra = [_intra_node(node, tuple(g), slow.get(node.name, {})) for node, g in members if len(g) > 1]
    slowest, gbps = min(intra, key=lambda c: c[1]) if intra else (SlowestLink.NVLINK, math.inf)
    nvlink_us = RING_HOP_LATENCY_US[SlowestLink.NVLINK]
    actual = Ring(gpus, gbps, RING_HOP_LATENCY_US[slowest])
    best = Ring(gpus, REFERENCE_NVLINK_GBPS, nvlink_us)
    if len(members) > 1:
        level = network_class([node.labels for node, _ in members], tier_labels=tier_labels)
        if level is SlowestLink.NVLINK_DOMAIN:
            net = NVLINK_DOMAIN_GBPS
        else:
            net = min(node_network_gbps(node) for node, _ in members) * TIER_BANDWIDTH_FACTOR[level]
        if net <= gbps:
            slowest, gbps = level, net
        nodes, block_us = len(members), RING_HOP_LATENCY_US[SlowestLink.NET_BLOCK]
        actual = Ring(gpus, gbps, actual.intra_us, nodes, RING_HOP_LATENCY_US[level])
        best = Ring(gpus, min(REFERENCE_NVLINK_GBPS, REFERENCE_NETWORK_GBPS), nvlink_us, nodes, block_us)
    return JobTiming(slowest, gbps, max(1.0, step.step_s(actual) / step.step_s(best)))
