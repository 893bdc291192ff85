"""Planning a whole gang at once: which node each member goes to, with which devices. Pure.

Called when the first member of a gang is filtered. The plan covers every member not yet placed,
on the nodes kube-scheduler offered for that member (its own filters ran first, so node
selectors and required node affinity, e.g. Kueue TAS's pins on tier labels, are already
respected). Members are taken to be alike (one pod template per gang, as PodGroups, JobSets and
PyTorchJobs build them): each slot is the filtered member's request.

How the plan is chosen:

1. **Slots per node.** A node holds as many members as the decision core fits one after another
   (each decided on the node with the earlier members' devices taken), never more than needed:
   an 8-GPU member on an 8-GPU node gives one slot, so node-sized members get one node each.
   Nodes in the same state (memo token) are worked out once.
2. **The tightest domain.** For each network tier, closest first (``topology.network``), nodes
   are grouped by their label value; the first tier with a domain whose slots hold the whole gang
   wins. Past the last tier the whole offered set is one domain. A gang that requires a tier
   (``gpuweave.io/gang-tier``, ``required_tier``) stops at that tier: a domain of it or of a
   closer tier holds the gang, or the plan misses and the gang waits. Members already placed
   (bound before an extender restart, or before a reservation expired) pin the domain: only the
   domain that holds them all at that tier counts.
3. **Inside a domain** the nodes of the gang's previous attempt come first (``preferred``:
   recovery after a restart of every member keeps the surviving nodes and adds a spare beside
   them), then nodes that hold more members (members on one node talk over NVLink), then the
   better topology score (the core's quality), then the name; among domains of the winning tier
   the one reusing more previous nodes wins, then the higher summed quality, then the one with
   less spare room (bigger domains stay whole for bigger gangs), then the name.

If no domain holds the gang, the answer is a ``GangMiss`` with the reason; nothing is held.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from devicemodel.assignment import PodAssignment
from devicemodel.errors import InvalidInputError
from devicemodel.gangs import ANNOTATION_GANG_TIER
from scheduler_ext.decide.state import NodeState
from scheduler_ext.decide.verdict import ContainerPlan, Verdict, materialize
from topology.network import DEFAULT_TIER_LABELS, group_by_domain, tier_domain, tier_name

Decide = Callable[[NodeState], Verdict]  # one member's verdict on a node state
_PLANNED = "\x00gang-plan"  # holder of devices taken by earlier slots while packing one node
_NO_LABELS: Mapping[str, str] = {}


@dataclass(frozen=True)
class GangSlot:
    """One member's place: a node and the devices it will hold there."""

    node: str
    assignment: PodAssignment
    quality: float

    @property
    def devices(self) -> frozenset[str]:
        return frozenset(self.assignment.all_device_ids())


@dataclass(frozen=True)
class GangPlan:
    slots: tuple[GangSlot, ...]
    tier: int  # index into the tier labels; len(tier labels): only the whole offered set holds it
    domain: str  # the label value at that tier ("" for the whole set)


@dataclass(frozen=True)
class GangMiss:
    reason: str
    closest: tuple[str, ...] = ()  # nodes with room in the domain closest to holding the gang


@dataclass(frozen=True)
class GangAnswer:
    """Filter's answer for a gang member: the one node it may go to, or why none."""

    passed: list[str]
    failed: dict[str, str] = field(default_factory=dict)
    hopeless: dict[str, str] = field(default_factory=dict)
    retry: str = ""  # not placed now, for this reason: kube-scheduler tries again with its back-off


_Plans = tuple[tuple[float, tuple[ContainerPlan, ...]], ...]  # (quality, plan) per member a node holds


@dataclass(frozen=True)
class _NodeSlots:
    name: str
    plans: _Plans


def plan_gang(
    *,
    key: str,
    needed: int,
    candidates: Sequence[str],
    states: Mapping[str, NodeState],
    labels: Mapping[str, Mapping[str, str]],
    decide: Decide,
    tier_labels: Sequence[str] = DEFAULT_TIER_LABELS,
    placed_nodes: Sequence[str] = (),
    preferred: frozenset[str] = frozenset(),
    required_tier: str = "",
) -> GangPlan | GangMiss:
    """Plan ``needed`` members of gang ``key`` on ``candidates`` (see module doc). ``preferred``:
    the nodes the gang's previous attempt ran on (recovery keeps it where it was);
    ``required_tier``: a label of ``tier_labels`` one domain of which (or of a closer tier) must
    hold the whole gang, "" for none."""
    widest = _widest_tier(required_tier, tier_labels)
    slots = _slots_per_node(candidates, states, decide, needed=needed)
    best_seen = (0, "")
    for tier in range(widest + 1):
        groups = _domains(slots, labels, tier, tier_labels=tier_labels, placed_nodes=placed_nodes)
        options = []
        for domain, names in groups.items():
            chosen, capacity = _fill([slots[n] for n in names], needed, preferred=preferred)
            if chosen is None:
                if capacity > best_seen[0]:
                    best_seen = (capacity, _where(tier, domain, tier_labels))
                continue
            quality = round(sum(q for _, q in chosen), 6)
            again = sum(1 for n, _ in chosen if n in preferred)
            options.append((-again, -quality, capacity - needed, domain, chosen))
        if options:
            *_, domain, chosen = min(options, key=lambda o: (o[0], o[1], o[2], o[3]))
            return GangPlan(_materialize(chosen, slots, states), tier=tier, domain=domain)
    waiting = _waiting_domain(
        slots,
        candidates,
        states,
        labels,
        needed=needed,
        tier_labels=tier_labels[: widest + 1],
        placed_nodes=placed_nodes,
    )
    reason = _miss_reason(
        key, needed, len(set(candidates)), best_seen, placed_nodes, required_tier=required_tier
    )
    return GangMiss(reason, closest=waiting)


def _widest_tier(required_tier: str, tier_labels: Sequence[str]) -> int:
    """The widest tier a plan may use: the required one's index, else ``len(tier_labels)`` (the
    whole offered set)."""
    if not required_tier:
        return len(tier_labels)
    if required_tier not in tier_labels:
        raise InvalidInputError(
            f"required tier {required_tier!r} is not one of the tier labels {', '.join(tier_labels)}"
        )
    return list(tier_labels).index(required_tier)


def _slots_per_node(
    candidates: Sequence[str], states: Mapping[str, NodeState], decide: Decide, *, needed: int
) -> dict[str, _NodeSlots]:
    by_token: dict[int, _Plans] = {}
    slots: dict[str, _NodeSlots] = {}
    for name in dict.fromkeys(candidates):
        state = states.get(name)
        if state is None or state.layout is None:
            continue
        plans = by_token.get(state.token) if state.token >= 0 else None
        if plans is None:
            plans = _pack(state, decide, limit=needed)
            if state.token >= 0:
                by_token[state.token] = plans
        if plans:
            slots[name] = _NodeSlots(name, plans)
    return slots


def _waiting_domain(
    slots: Mapping[str, _NodeSlots],
    candidates: Sequence[str],
    states: Mapping[str, NodeState],
    labels: Mapping[str, Mapping[str, str]],
    *,
    needed: int,
    tier_labels: Sequence[str],
    placed_nodes: Sequence[str],
) -> tuple[str, ...]:
    """The nodes with room now in the labelled domain closest to holding the gang: the most
    members fit there now, among domains with enough nodes to hold it once they free (nodes
    times the most members one node holds now); ties to the closer tier. () when none qualifies."""
    per_node = max((len(n.plans) for n in slots.values()), default=1)
    with_inventory = [n for n in dict.fromkeys(candidates) if (s := states.get(n)) is not None and s.layout]
    best: tuple[int, tuple[str, ...]] = (0, ())
    for tier in range(len(tier_labels)):
        groups = _domains(slots, labels, tier, tier_labels=tier_labels, placed_nodes=placed_nodes)
        sizes = _domains(with_inventory, labels, tier, tier_labels=tier_labels, placed_nodes=placed_nodes)
        for domain, names in sorted(groups.items()):
            capacity = sum(len(slots[n].plans) for n in names)
            if len(sizes.get(domain, ())) * per_node >= needed and capacity > best[0]:
                best = (capacity, tuple(sorted(names)))
    return best[1]


def _pack(state: NodeState, decide: Decide, *, limit: int) -> _Plans:
    """Members that fit this node one after another, each with the earlier ones' devices taken."""
    plans: list[tuple[float, tuple[ContainerPlan, ...]]] = []
    current = state
    while len(plans) < limit:
        verdict = decide(current)
        if not verdict.fits or current.layout is None:
            break
        plans.append((verdict.quality, verdict.plan))
        taken = materialize(verdict.plan, current).all_device_ids()
        holders = dict(current.holders)
        holders.update(dict.fromkeys(taken, f"{_PLANNED}-{len(plans)}"))
        current = current.with_holders(holders)
    return tuple(plans)


def _domains(
    slots: Iterable[str],
    labels: Mapping[str, Mapping[str, str]],
    tier: int,
    *,
    tier_labels: Sequence[str],
    placed_nodes: Sequence[str],
) -> dict[str, list[str]]:
    groups = group_by_domain(((n, labels.get(n, _NO_LABELS)) for n in slots), tier, tier_labels=tier_labels)
    if not placed_nodes:
        return groups
    pinned = {tier_domain(labels.get(n, _NO_LABELS), tier, tier_labels=tier_labels) for n in placed_nodes}
    if len(pinned) != 1 or None in pinned:
        return {}
    domain = pinned.pop()
    assert domain is not None
    return {domain: groups[domain]} if domain in groups else {}


def _fill(
    nodes: list[_NodeSlots], needed: int, *, preferred: frozenset[str]
) -> tuple[list[tuple[str, float]] | None, int]:
    """(node, quality) per member from these nodes, or None when they hold fewer; and their room."""
    capacity = sum(len(n.plans) for n in nodes)
    if capacity < needed:
        return None, capacity
    ordered = sorted(
        nodes, key=lambda n: (n.name not in preferred, -min(len(n.plans), needed), -n.plans[0][0], n.name)
    )
    chosen: list[tuple[str, float]] = []
    for node in ordered:
        for quality, _ in node.plans[: needed - len(chosen)]:
            chosen.append((node.name, quality))
        if len(chosen) == needed:
            break
    return chosen, capacity


def _materialize(
    chosen: list[tuple[str, float]], slots: Mapping[str, _NodeSlots], states: Mapping[str, NodeState]
) -> tuple[GangSlot, ...]:
    """Device IDs for each chosen slot, each node's later slots after its earlier ones' devices."""
    result: list[GangSlot] = []
    current: dict[str, NodeState] = {}
    used: dict[str, int] = {}
    for name, quality in chosen:
        state = current.get(name) or states[name]
        index = used.get(name, 0)
        assignment = materialize(slots[name].plans[index][1], state)
        holders = dict(state.holders)
        holders.update(dict.fromkeys(assignment.all_device_ids(), f"{_PLANNED}-{index}"))
        current[name] = state.with_holders(holders)
        used[name] = index + 1
        result.append(GangSlot(node=name, assignment=assignment, quality=quality))
    return tuple(result)


def _where(tier: int, domain: str, tier_labels: Sequence[str]) -> str:
    if tier >= len(tier_labels):
        return "all offered nodes together"
    return f"{tier_name(tier, tier_labels=tier_labels)}={domain}"


def _miss_reason(
    key: str,
    needed: int,
    offered: int,
    best: tuple[int, str],
    placed_nodes: Sequence[str],
    *,
    required_tier: str,
) -> str:
    placed = f" beside its {len(placed_nodes)} placed member(s)" if placed_nodes else ""
    inside = f" inside one {required_tier} domain (its {ANNOTATION_GANG_TIER})" if required_tier else ""
    most = f"; the most any network domain holds is {best[0]} ({best[1]})" if best[0] else "; none holds one"
    return (
        f"gang {key} needs {needed} more member(s) placed together{inside}{placed}, all or none, and "
        f"the {offered} node(s) offered do not hold them{most}; no device is held for it"
    )
