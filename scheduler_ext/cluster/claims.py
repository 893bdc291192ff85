"""Claim-aware node scores for pods that ask for devices through ResourceClaims (DRA mode).

DRA's allocator checks that a node *can* meet a claim and then takes the first set that does; it
does not prefer the node where the claim is met by an NVLink-connected set with EFA adapters on
the GPUs' own PCIe root complexes. This module gives kube-scheduler that preference through the
extender's ``prioritize-claims`` verb (docs/extender.md, "Pods with ResourceClaims").

Pure core plus a watch-fed book:

- ``parse_slice`` / ``parse_claim``: what the extender keeps of a ResourceSlice of driver
  ``gpuweave.io`` (each device's type, ``nvlinkDomain``, ``resource.kubernetes.io/pcieRoot``,
  whether it is tainted) and of a ResourceClaim (its demand on ``gpu.gpuweave.io`` and
  ``efa.gpuweave.io``, its ``matchAttribute`` constraints, the devices its allocation holds).
  Hostile input costs bounded work: more than ``MAX_REQUESTS`` requests, a count above
  ``MAX_COUNT`` or more than ``MAX_DEVICES`` devices in a slice make the object unscoreable
  (score 0, logged once when it arrives), never a longer loop.
- ``score_node``: one node's free devices (as a ``NodeSummary``) against a pod's ``Demand``, 0..10.
- ``ClaimBook``: the claims and slices the watches feed; ``scores(pod, names)`` answers the verb.
  Nodes whose free devices look the same share one score (memoized per call), and a pod with no
  claim of ours gets zeros without a per-node loop.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

LOG = logging.getLogger(__name__)

DRIVER = "gpuweave.io"
GPU_CLASS = "gpu.gpuweave.io"
EFA_CLASS = "efa.gpuweave.io"
ATTR_TYPE = "type"
ATTR_NVLINK = "nvlinkDomain"
ATTR_PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
MATCH_NVLINK = {f"{DRIVER}/{ATTR_NVLINK}", ATTR_NVLINK}
MATCH_PCIE_ROOT = {ATTR_PCIE_ROOT}
MAX_REQUESTS = 64  # requests (and constraints) per claim; the API server allows 32
MAX_COUNT = 64  # devices per request
MAX_CLAIMS = 64  # claims per pod looked at
MAX_DEVICES = 1024  # devices per slice (the API server allows 128)
MAX_SCORE = 10
MAX_INTERNED = 100_000  # distinct node summaries kept for sharing (cleared past this)


# ---- values ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SliceDevice:
    """What the extender keeps of one device in a published ResourceSlice."""

    name: str
    type: str  # gpu, mig, efa
    domain: str  # nvlinkDomain; "" without NVLink
    root: str  # resource.kubernetes.io/pcieRoot; "" when not published
    tainted: bool


@dataclass(frozen=True)
class SliceEntry:
    node: str
    pool: str
    generation: int
    devices: tuple[SliceDevice, ...]


@dataclass(frozen=True)
class Demand:
    """What a pod's claims ask of one node: whole GPUs and EFA adapters of gpuweave.io, and the
    ``matchAttribute`` constraints that bind them: per ``nvlinkDomain`` constraint the GPUs that
    must share a domain; per ``pcieRoot`` constraint over GPUs and EFA adapters the (GPUs,
    adapters) that must share a root."""

    gpus: int = 0
    efas: int = 0
    nvlink_groups: tuple[int, ...] = ()
    root_groups: tuple[tuple[int, int], ...] = ()

    def __add__(self, other: Demand) -> Demand:
        return Demand(
            self.gpus + other.gpus,
            self.efas + other.efas,
            self.nvlink_groups + other.nvlink_groups,
            self.root_groups + other.root_groups,
        )

    @property
    def empty(self) -> bool:
        return self.gpus == 0 and self.efas == 0


NO_DEMAND = Demand()


@dataclass(frozen=True)
class ClaimEntry:
    key: str  # namespace/name
    demand: Demand | None  # None: not scoreable (too large, or a form not scored); see ``problem``
    problem: str
    allocated: bool
    devices: tuple[tuple[str, str], ...]  # (pool, device) of driver gpuweave.io in the allocation


@dataclass(frozen=True)
class NodeSummary:
    """A node's free devices as the score sees them (hashable: equal summaries, equal scores).

    ``domains``: per NVLink domain (a GPU without NVLink is a domain of its own), the free GPUs
    per PCIe root, sorted; ``efa``: free EFA adapters per PCIe root, sorted."""

    domains: tuple[tuple[tuple[str, int], ...], ...]
    efa: tuple[tuple[str, int], ...]


# ---- parsing (boundaries) ----------------------------------------------------------------------
class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class _Exactly(_Model):
    device_class: str = Field(default="", alias="deviceClassName")
    allocation_mode: str = Field(default="ExactCount", alias="allocationMode")
    count: int = Field(default=1, ge=0)


class _Request(_Model):
    name: str = ""
    exactly: _Exactly | None = None
    first_available: list[Any] | None = Field(default=None, alias="firstAvailable")


class _Constraint(_Model):
    requests: list[str] | None = None
    match_attribute: str | None = Field(default=None, alias="matchAttribute")


class _DeviceClaim(_Model):
    requests: list[_Request] = Field(default_factory=list)
    constraints: list[_Constraint] = Field(default_factory=list)


def _string_attr(attributes: Mapping[str, Any], name: str) -> str:
    value = attributes.get(name)
    if value is None and "/" not in name:
        value = attributes.get(f"{DRIVER}/{name}")
    if isinstance(value, Mapping) and isinstance(value.get("string"), str):
        return str(value["string"])[:256]
    return ""


def parse_slice(obj: Mapping[str, Any]) -> SliceEntry | None:
    """A ResourceSlice of driver gpuweave.io with a node, or None (another driver, no node, bad)."""
    spec = obj.get("spec")
    if not isinstance(spec, Mapping) or spec.get("driver") != DRIVER:
        return None
    pool = _mapping(spec.get("pool"))
    node = spec.get("nodeName") or pool.get("name")
    generation = pool.get("generation", 0)
    raw = spec.get("devices") or []
    if not isinstance(node, str) or not node or not isinstance(raw, list):
        return None
    if len(raw) > MAX_DEVICES:
        LOG.warning("ResourceSlice %s: %d devices (> %d), not scored", _meta_name(obj), len(raw), MAX_DEVICES)
        return None
    devices = []
    for device in raw:
        if not isinstance(device, Mapping) or not isinstance(device.get("name"), str):
            continue
        attributes = device.get("attributes")
        attributes = attributes if isinstance(attributes, Mapping) else {}
        kind = _string_attr(attributes, ATTR_TYPE)
        if kind not in ("gpu", "efa"):
            continue  # MIG devices and placements are not scored here
        taints = device.get("taints")
        devices.append(
            SliceDevice(
                name=device["name"],
                type=kind,
                domain=_string_attr(attributes, ATTR_NVLINK),
                root=_string_attr(attributes, ATTR_PCIE_ROOT),
                tainted=bool(taints) and isinstance(taints, list),
            )
        )
    return SliceEntry(
        node=node,
        pool=str(pool.get("name") or node),
        generation=generation if isinstance(generation, int) else 0,
        devices=tuple(devices),
    )


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _meta_name(obj: Mapping[str, Any]) -> str:
    metadata = _mapping(obj.get("metadata"))
    namespace, name = metadata.get("namespace") or "", metadata.get("name") or ""
    return f"{namespace}/{name}" if namespace else str(name)


def claim_key(obj: Mapping[str, Any]) -> str:
    metadata = _mapping(obj.get("metadata"))
    return f"{metadata.get('namespace') or 'default'}/{metadata.get('name') or ''}"


def _allocated_devices(obj: Mapping[str, Any]) -> tuple[bool, tuple[tuple[str, str], ...]]:
    status = obj.get("status")
    allocation = status.get("allocation") if isinstance(status, Mapping) else None
    if not isinstance(allocation, Mapping):
        return False, ()
    devices = _mapping(allocation.get("devices"))
    results = devices.get("results") or []
    if not isinstance(results, list):
        return True, ()
    held = []
    for result in results[: MAX_REQUESTS * MAX_COUNT]:
        if isinstance(result, Mapping) and result.get("driver") == DRIVER:
            pool, device = result.get("pool"), result.get("device")
            if isinstance(pool, str) and isinstance(device, str):
                held.append((pool, device))
    return True, tuple(held)


def parse_claim(obj: Mapping[str, Any]) -> ClaimEntry:
    """What the book keeps of one ResourceClaim (``resource.k8s.io/v1``)."""
    key = claim_key(obj)
    allocated, devices = _allocated_devices(obj)
    demand, problem = claim_demand(obj)
    if problem:
        LOG.info("ResourceClaim %s is not scored by the extender: %s", key, problem)
    return ClaimEntry(key=key, demand=demand, problem=problem, allocated=allocated, devices=devices)


def claim_demand(obj: Mapping[str, Any]) -> tuple[Demand | None, str]:
    """(demand, "") or (None, why not scored). Pure; cost bounded by ``MAX_REQUESTS``."""
    spec = obj.get("spec")
    devices = spec.get("devices") if isinstance(spec, Mapping) else None
    if devices is None:
        return NO_DEMAND, ""
    if not isinstance(devices, Mapping):
        return None, "spec.devices is not an object"
    requests, constraints = devices.get("requests") or [], devices.get("constraints") or []
    if not isinstance(requests, list) or not isinstance(constraints, list):
        return None, "spec.devices.requests or constraints is not a list"
    if len(requests) > MAX_REQUESTS or len(constraints) > MAX_REQUESTS:
        return None, f"{len(requests)} requests, {len(constraints)} constraints (> {MAX_REQUESTS})"
    try:
        claim = _DeviceClaim.model_validate({"requests": requests, "constraints": constraints})
    except ValidationError as exc:
        return None, f"spec.devices does not parse: {exc.errors()[0].get('msg', 'invalid')}"
    gpus, efas = 0, 0
    kinds: dict[str, tuple[str, int]] = {}  # request name -> (gpu | efa, count)
    for request in claim.requests:
        exactly = request.exactly
        if exactly is None:  # firstAvailable: the allocator picks among subrequests; not scored
            if request.first_available and any(
                isinstance(sub, Mapping) and sub.get("deviceClassName") in (GPU_CLASS, EFA_CLASS)
                for sub in request.first_available[:MAX_REQUESTS]
            ):
                return None, f"request {request.name!r} uses firstAvailable, which is not scored"
            continue
        if exactly.device_class not in (GPU_CLASS, EFA_CLASS):
            continue
        if exactly.allocation_mode != "ExactCount":
            return None, f"request {request.name!r} has allocationMode {exactly.allocation_mode!r}"
        if exactly.count > MAX_COUNT:
            return None, f"request {request.name!r} asks for {exactly.count} devices (at most {MAX_COUNT})"
        kind = "gpu" if exactly.device_class == GPU_CLASS else "efa"
        kinds[request.name] = (kind, exactly.count)
        if kind == "gpu":
            gpus += exactly.count
        else:
            efas += exactly.count
    nvlink: list[int] = []
    roots: list[tuple[int, int]] = []
    for constraint in claim.constraints:
        covered = set(constraint.requests) if constraint.requests else set(kinds)
        group_gpus = sum(kinds[n][1] for n in covered if n in kinds and kinds[n][0] == "gpu")
        group_efas = sum(kinds[n][1] for n in covered if n in kinds and kinds[n][0] == "efa")
        if constraint.match_attribute in MATCH_NVLINK and group_gpus > 1:
            nvlink.append(group_gpus)
        if constraint.match_attribute in MATCH_PCIE_ROOT and group_gpus and group_efas:
            roots.append((group_gpus, group_efas))
    return Demand(gpus=gpus, efas=efas, nvlink_groups=tuple(nvlink), root_groups=tuple(roots)), ""


# ---- scoring (pure) ------------------------------------------------------------------------------
def summarize(devices: Sequence[SliceDevice], held: Mapping[str, int] | frozenset[str]) -> NodeSummary:
    """The free (untainted, unallocated) GPUs per NVLink domain and root, and EFAs per root."""
    domains: dict[str, Counter[str]] = {}
    efa: Counter[str] = Counter()
    for device in devices:
        if device.tainted or device.name in held:
            continue
        if device.type == "gpu":
            domain = device.domain or f"\x00{device.name}"  # no NVLink: a domain of one
            domains.setdefault(domain, Counter())[device.root] += 1
        elif device.type == "efa":
            efa[device.root] += 1
    return NodeSummary(
        domains=tuple(sorted(tuple(sorted(roots.items())) for roots in domains.values())),
        efa=tuple(sorted(efa.items())),
    )


def _aligned_efas(roots: Sequence[tuple[str, int]], efa: Mapping[str, int], gpus: int) -> int:
    """EFA adapters on the PCIe roots of ``gpus`` GPUs taken from ``roots``, roots with the most
    free adapters first: how many of the claim's adapters can sit next to its GPUs."""
    aligned, left = 0, gpus
    for root, free in sorted(roots, key=lambda r: -efa.get(r[0], 0)):
        if left <= 0:
            break
        left -= min(free, left)
        aligned += efa.get(root, 0)
    return aligned


def _place_root_groups(
    roots: Sequence[tuple[str, int]], efa: Mapping[str, int], groups: Sequence[tuple[int, int]]
) -> bool:
    """Can every (GPUs, adapters) group that must share a PCIe root get one, from these GPUs?
    Largest groups first, each on the root it fills most tightly (a heuristic, not a search)."""
    free = dict(roots)
    adapters = dict(efa)
    for want_gpus, want_efas in sorted(groups, reverse=True):
        fits = [r for r, n in free.items() if n >= want_gpus and adapters.get(r, 0) >= want_efas]
        if not fits:
            return False
        root = min(fits, key=lambda r: (free[r] - want_gpus, adapters.get(r, 0) - want_efas, r))
        free[root] -= want_gpus
        adapters[root] -= want_efas
    return True


def score_node(summary: NodeSummary, demand: Demand) -> int:
    """0..10 for one node: 0 when its free devices cannot meet the demand or a ``matchAttribute``
    constraint cannot hold there (the allocator would refuse the node); 2 when the GPUs can only
    come from several NVLink domains; 7 when one domain holds them all, +2 when the EFA adapters
    can sit on the chosen GPUs' PCIe roots (always, without EFA), +1 when that domain is filled
    exactly (no GPU of it is stranded). A GPU-less demand scores 10 wherever its adapters fit."""
    gpus, efas = demand.gpus, demand.efas
    free_gpus = sum(n for roots in summary.domains for _, n in roots)
    efa = dict(summary.efa)
    if gpus > free_gpus or efas > sum(efa.values()):
        return 0
    if gpus == 0:
        return MAX_SCORE
    sizes = [sum(n for _, n in roots) for roots in summary.domains]
    if any(group > max(sizes) for group in demand.nvlink_groups):
        return 0  # a set that must share an NVLink domain fits in none
    loose_efas = efas - sum(e for _, e in demand.root_groups)  # adapters no constraint places
    best: tuple[int, int] | None = None  # (points, -domain size), larger is better
    for roots, size in zip(summary.domains, sizes, strict=True):
        if size < gpus or not _place_root_groups(roots, efa, demand.root_groups):
            continue
        aligned = loose_efas <= 0 or _aligned_efas(roots, efa, gpus) >= efas
        points = 5 + (2 if aligned else 0) + (1 if size == gpus else 0)
        if best is None or (points, -size) > best:
            best = (points, -size)
    if best is not None:
        return 2 + best[0]
    every_root: Counter[str] = Counter()
    for roots in summary.domains:
        for root, n in roots:
            every_root[root] += n
    if not _place_root_groups(tuple(every_root.items()), efa, demand.root_groups):
        return 0
    return 2


# ---- the book the watches feed -----------------------------------------------------------------
class ClaimBook:
    """ResourceClaims and gpuweave.io ResourceSlices as the watches (or a snapshot) deliver them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._slices: dict[str, SliceEntry] = {}  # slice name -> entry
        self._by_node: dict[str, set[str]] = {}  # node -> its slice names
        self._claims: dict[str, ClaimEntry] = {}  # namespace/name -> entry
        self._held: dict[str, Counter[str]] = {}  # pool -> device -> claims allocated it
        self._summaries: dict[str, NodeSummary] = {}  # node -> summary, dropped on change
        self._interned: dict[NodeSummary, NodeSummary] = {}  # one object per distinct summary

    # ---- writes ----
    def upsert_slice(self, obj: Mapping[str, Any]) -> None:
        name = _meta_name(obj)
        entry = parse_slice(obj)
        with self._lock:
            self._drop_slice(name)
            if entry is not None:
                self._slices[name] = entry
                self._by_node.setdefault(entry.node, set()).add(name)
                self._summaries.pop(entry.node, None)

    def delete_slice(self, obj: Mapping[str, Any]) -> None:
        with self._lock:
            self._drop_slice(_meta_name(obj))

    def _drop_slice(self, name: str) -> None:
        old = self._slices.pop(name, None)
        if old is not None:
            names = self._by_node.get(old.node, set())
            names.discard(name)
            if not names:
                self._by_node.pop(old.node, None)
            self._summaries.pop(old.node, None)

    def upsert_claim(self, obj: Mapping[str, Any]) -> None:
        entry = parse_claim(obj)
        with self._lock:
            self._drop_claim(entry.key)
            self._claims[entry.key] = entry
            for pool, device in entry.devices:
                self._held.setdefault(pool, Counter())[device] += 1
                self._invalidate(pool)

    def delete_claim(self, obj: Mapping[str, Any]) -> None:
        with self._lock:
            self._drop_claim(claim_key(obj))

    def _drop_claim(self, key: str) -> None:
        old = self._claims.pop(key, None)
        if old is None:
            return
        for pool, device in old.devices:
            held = self._held.get(pool)
            if held is not None:
                held[device] -= 1
                if held[device] <= 0:
                    del held[device]
                if not held:
                    del self._held[pool]
            self._invalidate(pool)

    def _invalidate(self, pool: str) -> None:
        """Drop the summaries a change of the pool's allocations touches: gpuweave.io names its
        pool after its node; a pool named otherwise drops them all (rare, and still correct)."""
        if pool in self._by_node:
            self._summaries.pop(pool, None)
        else:
            self._summaries.clear()

    # ---- reads ----
    def claim(self, key: str) -> ClaimEntry | None:
        return self._claims.get(key)

    def summary(self, node: str) -> NodeSummary | None:
        """The node's free gpuweave.io devices, or None when it publishes no slice of ours.
        Only the pool's newest generation counts (older slices are being replaced)."""
        cached = self._summaries.get(node)
        if cached is not None:
            return cached
        with self._lock:
            entries = [self._slices[n] for n in self._by_node.get(node, ())]
            if not entries:
                return None
            newest = max(e.generation for e in entries)
            devices = [d for e in entries if e.generation == newest for d in e.devices]
            pools = {e.pool for e in entries}
            held: set[str] = set()
            for pool in pools:
                held.update(self._held.get(pool, ()))
            summary = summarize(devices, frozenset(held))
            if len(self._interned) > MAX_INTERNED:
                self._interned.clear()
            summary = self._interned.setdefault(summary, summary)
            self._summaries[node] = summary
            return summary

    def pod_demand(self, pod: Mapping[str, Any]) -> Demand | None:
        """The summed demand of the pod's claims not allocated yet; NO_DEMAND when none is ours
        (or all are allocated already); None when one of them is not scoreable."""
        spec = _mapping(pod.get("spec"))
        claims = spec.get("resourceClaims")
        if not claims or not isinstance(claims, list):
            return NO_DEMAND
        if len(claims) > MAX_CLAIMS:
            LOG.info("pod %s: %d claims (> %d), not scored", _meta_name(pod), len(claims), MAX_CLAIMS)
            return None
        metadata = _mapping(pod.get("metadata"))
        namespace = str(metadata.get("namespace") or "default")
        status = _mapping(pod.get("status"))
        generated = {}
        for entry in (status.get("resourceClaimStatuses") or [])[:MAX_CLAIMS]:
            if isinstance(entry, Mapping) and isinstance(entry.get("name"), str):
                generated[entry["name"]] = entry.get("resourceClaimName")
        total = NO_DEMAND
        for ref in claims:
            if not isinstance(ref, Mapping):
                continue
            name = ref.get("resourceClaimName") or generated.get(str(ref.get("name")))
            if not isinstance(name, str) or not name:
                continue  # a template's claim not generated yet (or not needed): nothing known
            claim = self._claims.get(f"{namespace}/{name}")
            if claim is None or claim.allocated:
                continue  # unknown yet, or already placed: the allocator has no choice left
            if claim.demand is None:
                return None
            total = total + claim.demand
        return total

    def scores(self, pod: Mapping[str, Any], names: Sequence[str]) -> list[int]:
        """Scores 0..10 for ``names``; all 0 for a pod whose claims ask nothing of gpuweave.io."""
        spec = _mapping(pod.get("spec"))
        if not spec.get("resourceClaims"):
            return [0] * len(names)
        demand = self.pod_demand(pod)
        if demand is None or demand.empty:
            return [0] * len(names)
        # Per node only C-level passes and dict lookups: cached summaries first, the few
        # missing ones built, then one score per distinct summary.
        summaries: list[NodeSummary | None] = list(map(self._summaries.get, names))
        pooled = self._by_node
        for i in [i for i, summary in enumerate(summaries) if summary is None]:
            if names[i] in pooled:
                summaries[i] = self.summary(names[i])
        keys = list(map(id, summaries))  # summaries are interned: equal ones are one object
        memo: dict[int, int] = {id(None): 0}
        for summary in {id(x): x for x in summaries if x is not None}.values():
            memo[id(summary)] = score_node(summary, demand)
        return list(map(memo.__getitem__, keys))
