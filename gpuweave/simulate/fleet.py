"""The simulated cluster's nodes, built from node profiles (built-in machines or users' files).

Profiles describe GPUs and their interconnect; the host CPU and memory a scheduler also needs come
from a small table of the real machines (a user profile gets a generic host).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from devicemodel.errors import InvalidInputError
from devicemodel.inventory import Architecture, NicType, NodeInventory
from devicemodel.spec import NodeProfile
from hardware.profiles import is_rack, load_profile, load_rack
from topology.graph import TopologyGraph
from topology.network import LABEL_AWS_LAYER_1, LABEL_AWS_LAYER_2, LABEL_AWS_LAYER_3, LABEL_GPU_CLIQUE

DEFAULT_PROFILES = ("p5.48xlarge", "p4d.24xlarge", "dgx-a100", "l40s-pcie-8")
DEFAULT_NODES = 16
DEFAULT_NODES_PER_BLOCK = 2  # nodes of one profile per layer-3 network block
MIG_PROFILES = frozenset({"dgx-a100", "dgx-h100"})  # nodes whose GPUs the MIG manager may reshape
# Host vCPUs (milli) and memory (MiB) of the real machines.
HOST_SPECS: dict[str, tuple[int, int]] = {
    "p5.48xlarge": (192_000, 2_097_152),
    "p4d.24xlarge": (96_000, 1_179_648),
    "dgx-a100": (256_000, 2_097_152),
    "dgx-h100": (224_000, 2_097_152),
    "dgx1-v100": (80_000, 524_288),
    "l40s-pcie-8": (192_000, 1_572_864),
    "a100-pcie-nvbridge-4": (64_000, 524_288),
    "gb200-compute-tray": (144_000, 491_520),  # 2 Grace CPUs of 72 cores, 480 GiB LPDDR5X
}
GENERIC_HOST = (128_000, 1_048_576)
_LABEL_UNSAFE = re.compile(r"[^a-z0-9-]+")


@dataclass(frozen=True)
class FleetNode:
    name: str
    profile: str
    inventory: NodeInventory
    graph: TopologyGraph
    cpu_milli: int
    memory_mib: int
    mig_managed: bool
    labels: Mapping[str, str] = field(default_factory=dict)  # network tier labels (EKS layers, clique)
    node_profile: NodeProfile | None = None  # the node's own profile (a rack's tray: with its domain)
    rack: str = ""  # the rack the node is a tray of ("" outside racks)

    @property
    def gpus(self) -> int:
        return len(self.inventory.gpus)

    @property
    def product(self) -> str:
        return self.inventory.gpus[0].product if self.inventory.gpus else ""

    @property
    def architecture(self) -> Architecture:
        return self.inventory.gpus[0].architecture if self.inventory.gpus else Architecture.UNKNOWN

    @property
    def has_efa(self) -> bool:
        return any(nic.type is NicType.EFA for nic in self.inventory.nics)


def share_pool(fleet: Sequence[FleetNode]) -> frozenset[int]:
    """Nodes whose GPUs are shared (fractional inference); the rest serve whole GPUs.

    Sharing is configured per GPU in gpuweave and a shared GPU serves no whole-GPU request, so the
    simulated cluster keeps an inference pool: the l40s-pcie-8 nodes when there are any; on a fleet
    of NVLink cliques (NVL72 racks), whole cliques, the smallest first, as long as they add up to at
    most a quarter of the nodes (so the cliques gangs need stay whole: a degraded rack's partition
    serves inference); else every fourth node.
    """
    pool = frozenset(i for i, n in enumerate(fleet) if n.profile == "l40s-pcie-8")
    if pool and len(pool) < len(fleet):
        return pool
    pool = _clique_share_pool(fleet)
    if pool and len(pool) < len(fleet):
        return pool
    return frozenset(i for i in range(len(fleet)) if i % 4 == 3) if len(fleet) > 1 else frozenset()


def _clique_share_pool(fleet: Sequence[FleetNode]) -> frozenset[int]:
    """Whole cliques, smallest first (of equal size, the later one), up to a quarter of the nodes;
    empty unless every node is in a clique."""
    cliques = clique_members(fleet)
    if not cliques or sum(len(m) for m in cliques.values()) < len(fleet):
        return frozenset()
    quota = len(fleet) // 4
    pool: set[int] = set()
    for members in sorted(cliques.values(), key=lambda m: (len(m), -m[0])):
        if len(pool) + len(members) <= quota:
            pool.update(members)
    return frozenset(pool)


def clique_members(fleet: Sequence[FleetNode]) -> dict[str, list[int]]:
    """NVLink clique (the ``nvidia.com/gpu.clique`` label's value) -> its nodes, in fleet order."""
    cliques: dict[str, list[int]] = {}
    for index, node in enumerate(fleet):
        clique = node.labels.get(LABEL_GPU_CLIQUE)
        if clique is not None:
            cliques.setdefault(clique, []).append(index)
    return cliques


def clique_name(node: FleetNode) -> str:
    """A readable name of the node's clique: ``<rack> clique <ID>`` ("" outside any clique)."""
    clique = node.labels.get(LABEL_GPU_CLIQUE)
    if clique is None:
        return ""
    return f"{node.rack or clique.rsplit('.', 1)[0]} clique {clique.rsplit('.', 1)[-1]}"


def nvlink_pool_gpus(fleet: Sequence[FleetNode], share_nodes: frozenset[int]) -> int:
    """On a fleet whose whole-GPU nodes are all in NVLink cliques, the GPUs of the whole-GPU nodes
    of its largest clique (the most one clique-bound gang can get); 0 on any other fleet."""
    whole = [i for i in range(len(fleet)) if i not in share_nodes]
    if not whole or any(LABEL_GPU_CLIQUE not in fleet[i].labels for i in whole):
        return 0
    per_clique: dict[str, int] = {}
    for i in whole:
        clique = fleet[i].labels[LABEL_GPU_CLIQUE]
        per_clique[clique] = per_clique.get(clique, 0) + fleet[i].gpus
    return max(per_clique.values())


def parse_profiles(text: str | None) -> tuple[str, ...]:
    if not text:
        return DEFAULT_PROFILES
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    if not names:
        raise InvalidInputError("--profiles is empty; give one or more profile names or YAML paths")
    return names


def network_labels(profile: str, ordinal: int, *, nodes_per_block: int) -> dict[str, str]:
    """EKS network tier labels of the ``ordinal``-th node of ``profile``.

    As EC2 places instances of one type from one reservation near each other, nodes of a profile
    fill layer-3 blocks of ``nodes_per_block`` in order; each profile has its own layer-2 group,
    and every node shares one layer-1 (spine) node. So a two-node gang fits one block only when
    both nodes of a block are free; else it crosses to layer 2 (same profile) or the spine.
    """
    short = _LABEL_UNSAFE.sub("", profile.lower())[:20]
    return {
        LABEL_AWS_LAYER_1: "nn-spine-0",
        LABEL_AWS_LAYER_2: f"nn-{short}-l2",
        LABEL_AWS_LAYER_3: f"nn-{short}-b{ordinal // max(nodes_per_block, 1)}",
    }


def build_fleet(
    profiles: Sequence[str], *, nodes: int, nodes_per_block: int = DEFAULT_NODES_PER_BLOCK
) -> tuple[FleetNode, ...]:
    """``nodes`` nodes, profiles taken round-robin (4 profiles x 4 nodes by default), each with
    network tier labels (``network_labels``)."""
    if nodes < 1:
        raise InvalidInputError(f"--nodes {nodes}: a cluster needs at least one node")
    if nodes_per_block < 1:
        raise InvalidInputError(
            f"--nodes-per-block {nodes_per_block}: a network block holds at least one node"
        )
    fleet = []
    ordinals: dict[str, int] = {}
    for profile, node_name, rack in _node_profiles(profiles, nodes):
        inventory = profile.spec.to_inventory(node_name=node_name)
        if not inventory.gpus:
            raise InvalidInputError(f"profile {profile.name} has no GPUs; the simulation needs GPU nodes")
        cpu, memory = HOST_SPECS.get(profile.name, GENERIC_HOST)
        ordinal = ordinals.get(profile.name, 0)
        ordinals[profile.name] = ordinal + 1
        labels = network_labels(profile.name, ordinal, nodes_per_block=nodes_per_block)
        if inventory.nvswitch is not None and inventory.nvswitch.clique is not None:
            labels[LABEL_GPU_CLIQUE] = inventory.nvswitch.clique  # as the node's agent publishes it
        fleet.append(
            FleetNode(
                name=node_name,
                profile=profile.name,
                inventory=inventory,
                graph=TopologyGraph.from_inventory(inventory),
                cpu_milli=cpu,
                memory_mib=memory,
                mig_managed=profile.name in MIG_PROFILES and any(g.mig_capable for g in inventory.gpus),
                labels=labels,
                node_profile=profile,
                rack=rack,
            )
        )
    return tuple(fleet)


def new_machine(template: FleetNode, name: str) -> FleetNode:
    """A fresh machine of ``template``'s profile named ``name`` (what a provisioner launches in its
    place or next to it): its own device UUIDs (derived from its name, as its agent derives them),
    the template's network tier labels (the same placement group), its host table entry."""
    profile = template.node_profile or load_profile(template.profile)
    inventory = profile.spec.to_inventory(node_name=name)
    labels = {k: v for k, v in template.labels.items() if k != LABEL_GPU_CLIQUE}
    if inventory.nvswitch is not None and inventory.nvswitch.clique is not None:
        labels[LABEL_GPU_CLIQUE] = inventory.nvswitch.clique
    return replace(
        template, name=name, inventory=inventory, graph=TopologyGraph.from_inventory(inventory), labels=labels
    )


def reserve_rows(fleet: Sequence[FleetNode], count: int) -> tuple[FleetNode, ...]:
    """``count`` rows for machines a scale-up may add: placeholders with no GPU, no NIC and no
    label (``reserve-NN``), which the simulation keeps absent until a machine joins there."""
    if not fleet:
        return ()
    rows = []
    for i in range(count):
        name = f"reserve-{i:02d}"
        empty = replace(
            fleet[0].inventory, name=name, gpus=(), mig_devices=(), nics=(), nvlinks=(), nvswitch=None
        )
        rows.append(replace(fleet[0], name=name, inventory=empty, mig_managed=False, labels={}))
    return tuple(rows)


def _node_profiles(profiles: Sequence[str], nodes: int) -> list[tuple[NodeProfile, str, str]]:
    """(profile, node name, rack) of each of ``nodes`` nodes, the names taken round-robin.

    A node profile gives one node per turn (``<profile>-NN``); a rack profile gives a whole rack
    per turn (``<rack>-rR-NN``: its trays in order, each with the rack's NVLink domain; every rack
    instance has its own cluster UUID). The last rack is cut short when ``nodes`` runs out.
    """
    loaded: dict[str, NodeProfile | tuple[NodeProfile, ...]] = {}
    racks: dict[str, int] = {}
    for name in dict.fromkeys(profiles):
        loaded[name] = load_profile(name) if not is_rack(name) else ()
    built: list[tuple[NodeProfile, str, str]] = []
    turn = 0
    while len(built) < nodes:
        name = profiles[turn % len(profiles)]
        entry = loaded[name]
        if isinstance(entry, NodeProfile):
            built.append((entry, f"{entry.name}-{turn // len(profiles):02d}", ""))
        else:
            rack, node = load_rack(name)
            instance = racks.get(rack.name, 0)
            racks[rack.name] = instance + 1
            rack_name = f"{rack.name}-r{instance}"
            for slot, tray in enumerate(rack.nodes(node, instance=instance)[: nodes - len(built)]):
                built.append((tray, f"{rack_name}-{slot:02d}", rack_name))
        turn += 1
    return built
