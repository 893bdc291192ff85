"""The topology graph of one node: GPUs and NICs, the link class of every pair, and its shape.

Built once per inventory and then only queried. Every pair's link and bandwidth sit in a plain
dict (the queries on the hot path, e.g. the device plugin's set search, are lookups); networkx is
imported only by the graph algorithms (NVLink components and cliques), so a process that never
asks for them does not load it (~13 MB, ~0.2 s). Every query returns our own values
(``PairLink``, tuples, frozensets), never a networkx object, so callers do not depend on it and
cannot mutate it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import cached_property
from typing import TYPE_CHECKING

from devicemodel.errors import TopologyError
from devicemodel.inventory import Gpu, Nic, NodeInventory
from topology.links import LinkClass, PairLink, link_gbps, pcie_x16_gbps
from topology.matrix import MatrixRow, TopologyMatrix
from topology.pcie import PciePlace, pcie_class, place_of, switch_root_ports

if TYPE_CHECKING:
    import networkx as nx

__all__ = ["LinkClass", "PairLink", "TopologyGraph", "TopologyShape"]

_Node = tuple[str, int | str]
_Edges = dict[frozenset[_Node], tuple[PairLink, float]]  # pair of nodes -> (link, modelled GB/s)


@dataclass(frozen=True)
class TopologyShape:
    """Everything set scoring depends on, by GPU position, with no names or UUIDs.

    Two nodes of the same model have equal shapes, so search results memoized under a shape are
    shared between them. Positions are the GPUs' order in ``TopologyGraph.gpu_indices``.
    """

    bandwidth_gbps: tuple[tuple[float, ...], ...]  # pair bandwidth; 0 on the diagonal
    nvlinked: tuple[tuple[bool, ...], ...]  # pair reaches by NVLink or NVSwitch (not found slow)
    host_gbps: tuple[float, ...]  # each GPU's PCIe x16 host link
    nic_local: tuple[bool, ...]  # a NIC sits on the GPU's own PCIe switch
    numa_rank: tuple[int, ...]  # NUMA node, renumbered by first appearance
    switch_rank: tuple[int, ...]  # PCIe switch (or root port), renumbered by first appearance

    @property
    def size(self) -> int:
        return len(self.host_gbps)


def _gpu_node(index: int) -> tuple[str, int]:
    return ("gpu", index)


def _nic_node(name: str) -> tuple[str, str]:
    return ("nic", name)


def _nvlink_lanes(inventory: NodeInventory) -> dict[frozenset[int], int]:
    """Direct NVLink lanes per unordered pair; a pair reported from both ends counts once (max)."""
    known = {g.index for g in inventory.gpus}
    lanes: dict[frozenset[int], int] = {}
    for link in inventory.nvlinks:
        if link.gpu_a not in known or link.gpu_b not in known or link.gpu_a == link.gpu_b:
            raise TopologyError(
                f"node {inventory.name}: NVLink {link.gpu_a}-{link.gpu_b} names an unknown GPU or "
                f"links a GPU to itself; GPUs are {sorted(known)}; fix the inventory or profile"
            )
        pair = frozenset((link.gpu_a, link.gpu_b))
        lanes[pair] = max(lanes.get(pair, 0), link.links)
    return lanes


def _gpu_pair_link(a: Gpu, b: Gpu, *, lanes: dict[frozenset[int], int], fabric: frozenset[int],
                   fabric_links: int, ports: dict[str, str | None]) -> PairLink:
    """NVLink beats PCIe; an NVSwitch fabric beats direct lanes only when it is wider."""
    if a.index == b.index:
        return PairLink(LinkClass.X)
    direct = lanes.get(frozenset((a.index, b.index)), 0)
    in_fabric = a.index in fabric and b.index in fabric
    if in_fabric and fabric_links >= direct:
        return PairLink(LinkClass.NVSWITCH, fabric_links)
    if direct > 0:
        return PairLink(LinkClass.NVLINK, direct)
    return PairLink(pcie_class(place_of(a, ports), place_of(b, ports)))


class TopologyGraph:
    """Typed queries over one node's GPUs, NICs and the links between them."""

    def __init__(self, *, name: str, gpus: tuple[Gpu, ...], nics: tuple[Nic, ...], edges: _Edges,
                 lanes: dict[frozenset[int], int] | None = None,
                 root_ports: dict[str, str | None] | None = None) -> None:
        self._name = name
        self._gpus = {g.index: g for g in sorted(gpus, key=lambda g: g.index)}
        self._nics = {n.name: n for n in nics}
        self._edges = edges
        self._lanes = dict(lanes or {})
        self._root_ports = dict(root_ports or {})

    @classmethod
    def from_inventory(cls, inventory: NodeInventory) -> TopologyGraph:
        indices = [g.index for g in inventory.gpus]
        if len(set(indices)) != len(indices):
            raise TopologyError(f"node {inventory.name}: duplicate GPU indices in {sorted(indices)}")
        lanes = _nvlink_lanes(inventory)
        fabric = frozenset(inventory.nvswitch.gpus) if inventory.nvswitch else frozenset()
        fabric_links = inventory.nvswitch.links_per_gpu if inventory.nvswitch else 0
        ports = switch_root_ports(inventory)
        edges: _Edges = {}
        for i, a in enumerate(inventory.gpus):
            for b in inventory.gpus[i + 1:]:
                link = _gpu_pair_link(a, b, lanes=lanes, fabric=fabric, fabric_links=fabric_links,
                                      ports=ports)
                gbps = link_gbps(link, architectures=(a.architecture, b.architecture))
                kept = inventory.degraded_fraction(a.index, b.index)
                if kept is not None and link.is_nvlink:  # found slow: its measured share, never faster
                    link, gbps = replace(link, degraded=True), gbps * min(1.0, max(0.0, kept))
                edges[frozenset((_gpu_node(a.index), _gpu_node(b.index)))] = (link, gbps)
            for nic in inventory.nics:
                link = PairLink(pcie_class(place_of(a, ports), place_of(nic, ports)))
                gbps = link_gbps(link, architectures=(a.architecture,))
                edges[frozenset((_gpu_node(a.index), _nic_node(nic.name)))] = (link, gbps)
        return cls(name=inventory.name, gpus=inventory.gpus, nics=inventory.nics, edges=edges, lanes=lanes,
                   root_ports=ports)

    @property
    def name(self) -> str:
        return self._name

    @property
    def gpu_indices(self) -> tuple[int, ...]:
        """GPU indices in ascending order; a GPU's position in this tuple is its shape position."""
        return tuple(self._gpus)

    @property
    def nic_names(self) -> tuple[str, ...]:
        return tuple(self._nics)

    def gpu(self, index: int) -> Gpu:
        self._require_gpu(index)
        return self._gpus[index]

    def pair_link(self, a: int, b: int) -> PairLink:
        """The link class between GPUs ``a`` and ``b`` as ``nvidia-smi topo -m`` shows it."""
        self._require_gpu(a)
        self._require_gpu(b)
        if a == b:
            return PairLink(LinkClass.X)
        return self._edges[frozenset((_gpu_node(a), _gpu_node(b)))][0]

    def pair_bandwidth(self, a: int, b: int) -> float:
        """Modelled unidirectional GB/s between GPUs ``a`` and ``b`` (see ``topology.links``)."""
        link = self.pair_link(a, b)
        if a == b:
            return link_gbps(link, architectures=(self._gpus[a].architecture,))
        return self._edges[frozenset((_gpu_node(a), _gpu_node(b)))][1]

    def direct_nvlinks(self, a: int, b: int) -> int:
        """NVLink lanes joining GPUs ``a`` and ``b`` directly (0 through NVSwitches only, or none)."""
        self._require_gpu(a)
        self._require_gpu(b)
        return self._lanes.get(frozenset((a, b)), 0) if a != b else 0

    def pcie_link(self, a: int, b: int) -> PairLink:
        """The PCIe path between GPUs ``a`` and ``b``, ignoring any NVLink (for PCIe-only models)."""
        self._require_gpu(a)
        self._require_gpu(b)
        if a == b:
            return PairLink(LinkClass.X)
        return PairLink(pcie_class(self._place(self._gpus[a]), self._place(self._gpus[b])))

    def gpu_nic_link(self, gpu: int, nic: str) -> PairLink:
        self._require_gpu(gpu)
        if nic not in self._nics:
            raise TopologyError(f"node {self._name} has no NIC {nic!r}; NICs are {list(self._nics)}")
        return self._edges[frozenset((_gpu_node(gpu), _nic_node(nic)))][0]

    def nics_near(self, gpu: int) -> tuple[str, ...]:
        """NICs on the GPU's PCIe switch; if none, those on its NUMA node, closest first."""
        self._require_gpu(gpu)
        links = [(self.gpu_nic_link(gpu, name), name) for name in self._nics]
        on_switch = sorted(name for link, name in links if link.link_class is LinkClass.PIX)
        if on_switch:
            return tuple(on_switch)
        same_numa = [(link.link_class.rank, name) for link, name in links
                     if link.link_class is not LinkClass.SYS]
        return tuple(name for _, name in sorted(same_numa))

    def nvlink_components(self, available: Iterable[int] | None = None) -> list[frozenset[int]]:
        """Groups of GPUs joined by NVLink paths (not necessarily all pairs), largest first; a pair
        an active check found slow is no NVLink path here (nor in ``largest_nvlink_clique``)."""
        import networkx as nx  # noqa: PLC0415 (deferred: only graph algorithms need it)

        subgraph = self._nvlink_subgraph(available)
        components = [_gpu_indices_of(c) for c in nx.connected_components(subgraph)]
        return sorted(components, key=lambda c: (-len(c), min(c)))

    def largest_nvlink_clique(self, available: Iterable[int] | None = None) -> frozenset[int]:
        """The largest set of GPUs whose every pair is NVLink-connected (smallest indices on ties)."""
        import networkx as nx  # noqa: PLC0415 (deferred: only graph algorithms need it)

        subgraph = self._nvlink_subgraph(available)
        if subgraph.number_of_nodes() == 0:
            return frozenset()
        cliques = [_gpu_indices_of(c) for c in nx.find_cliques(subgraph)]
        return max(cliques, key=lambda c: (len(c), [-i for i in sorted(c)]))

    def matrix(self) -> TopologyMatrix:
        """Rows of an ``nvidia-smi topo -m`` style table: GPUs then NICs, with NUMA affinity."""
        gpu_names = [f"GPU{i}" for i in self._gpus]
        nic_names = [f"NIC{i}" for i in range(len(self._nics))]
        rows = [self._gpu_row(i) for i in self._gpus] + [self._nic_row(n) for n in self._nics]
        legend = tuple(zip(nic_names, self._nics, strict=True))
        return TopologyMatrix(columns=tuple(gpu_names + nic_names), rows=tuple(rows), nic_legend=legend)

    @cached_property
    def shape_key(self) -> TopologyShape:
        """The node's shape: equal for identical nodes, so it keys memoized searches."""
        order = list(self._gpus.values())
        bandwidth = tuple(tuple(0.0 if a.index == b.index else self.pair_bandwidth(a.index, b.index)
                                for b in order) for a in order)
        nvlinked = tuple(tuple(a.index != b.index and self.pair_link(a.index, b.index).nvlink_usable
                               for b in order) for a in order)
        return TopologyShape(
            bandwidth_gbps=bandwidth,
            nvlinked=nvlinked,
            host_gbps=tuple(pcie_x16_gbps(g.architecture) for g in order),
            nic_local=tuple(self._has_nic_on_switch(g.index) for g in order),
            numa_rank=_first_seen_ranks([g.numa_node for g in order]),
            switch_rank=_first_seen_ranks([g.pcie_switch or f"root:{g.pcie_root}" for g in order]),
        )

    def _has_nic_on_switch(self, gpu: int) -> bool:
        return any(self.gpu_nic_link(gpu, n).link_class is LinkClass.PIX for n in self._nics)

    def _nvlink_subgraph(self, available: Iterable[int] | None) -> nx.Graph[_Node]:
        import networkx as nx  # noqa: PLC0415 (deferred: only graph algorithms need it)

        chosen = self.gpu_indices if available is None else tuple(available)
        for index in chosen:
            self._require_gpu(index)
        subgraph: nx.Graph[_Node] = nx.Graph()
        subgraph.add_nodes_from(_gpu_node(i) for i in chosen)
        for a in chosen:
            for b in chosen:
                if a < b and self.pair_link(a, b).nvlink_usable:
                    subgraph.add_edge(_gpu_node(a), _gpu_node(b))
        return subgraph

    def _gpu_row(self, index: int) -> MatrixRow:
        cells = [self.pair_link(index, other).label for other in self._gpus]
        cells += [self.gpu_nic_link(index, nic).label for nic in self._nics]
        numa = str(self._gpus[index].numa_node)
        return MatrixRow(name=f"GPU{index}", cells=tuple(cells), numa_affinity=numa)

    def _nic_row(self, name: str) -> MatrixRow:
        nic = self._nics[name]
        cells = [self.gpu_nic_link(i, name).label for i in self._gpus]
        cells += ["X" if other == name else pcie_class(self._place(nic), self._place(self._nics[other])).value
                  for other in self._nics]
        position = list(self._nics).index(name)
        return MatrixRow(name=f"NIC{position}", cells=tuple(cells), numa_affinity=str(nic.numa_node))

    def _place(self, device: Gpu | Nic) -> PciePlace:
        return place_of(device, self._root_ports)

    def _require_gpu(self, index: int) -> None:
        if index not in self._gpus:
            raise TopologyError(
                f"node {self._name} has no GPU {index}; GPUs are {list(self._gpus)}"
            )


def _gpu_indices_of(nodes: Iterable[_Node]) -> frozenset[int]:
    return frozenset(key for kind, key in nodes if kind == "gpu" and isinstance(key, int))


def _first_seen_ranks(values: list[int] | list[str]) -> tuple[int, ...]:
    ranks: dict[int | str, int] = {}
    return tuple(ranks.setdefault(v, len(ranks)) for v in values)
