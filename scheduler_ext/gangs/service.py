"""The extender's gang verbs: plan a gang when its first member is filtered, steer the others to
their planned nodes, hand a slot to its member at bind, release what expires.

Glue between the pure parts (``gangs`` identity, ``gangs.plan`` planning, ``gangs.book``
reservations) and the cluster cache, which holds every open slot's devices as an assumed
holding, so no other pod can take them and no device is held twice (the cache refuses a double
booking). Nothing survives a restart but what the cluster says: members already bound hold their
devices through their assignment annotations; once the cache is synced, ``rebuild`` holds the
places of partly bound gangs again, and any other member filtered later plans the rest around them.

Recovery may preempt: a gang that ran before (its family's nodes are remembered) and does not fit
now is planned again as if every pod of lower priority than its members were gone (within its
required tier, ``gpuweave.io/gang-tier``, as every plan of it is); where that plan holds it, the
nodes of the plan's domain that such an eviction would open for a member are the gang's room.
Filter answers the offered nodes in the room as resolvable; the preempt verb
(``preemption_room``) plans over the nodes last offered plus kube-scheduler's candidates (nodes
its own filters rejected, e.g. for too few free GPUs, reach only the preempt call) and narrows
the candidates to the room. Every other gang that does not fit is answered unresolvable, and its
members' preemption is refused.

A gang of one (``Gang.alone``: ``gpuweave.io/gang`` with size 1) has no plan and no reservation:
filter, prioritize and bind treat it as any pod, and its bind remembers its node as its family's
(``bound_alone``). Only when it fits no offered node do the gang rules apply (``unplaced_alone``):
re-created after an attempt that ran, its room is found as a recovering gang's is, and the preempt
verb narrows to it; otherwise every node is unresolvable and its preemption is refused.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from devicemodel.gangs import BadGangError, Gang, gang_family, gang_of, pod_group_entry
from scheduler_ext.cluster.cache import ClusterCache, DoubleBookingError
from scheduler_ext.cluster.objects import PodRecord
from scheduler_ext.cluster.preempt import evictable
from scheduler_ext.decide.core import DecisionCore
from scheduler_ext.decide.state import NodeState
from scheduler_ext.decide.verdict import Verdict
from scheduler_ext.gangs.book import DEFAULT_TTL_S, SLOT_PREFIX, Clock, GangBook, Reservation, Slot
from scheduler_ext.gangs.plan import GangMiss, GangPlan, plan_gang
from scheduler_ext.pods.host import HostRequest, host_requests
from scheduler_ext.pods.requests import BadPodRequestError, PodRequest, pod_request
from topology.network import DEFAULT_TIER_LABELS, lowest_common_tier, tier_domain

LOG = logging.getLogger(__name__)
Outcome = Callable[[str], None]  # planned | missed | expired | completed (the metric)


class PodGroupSizes:
    """``NS/NAME`` -> ``minMember`` of the PodGroups seen (fed by a watch when the CRD exists)."""

    def __init__(self) -> None:
        self.sizes: dict[str, object] = {}  # minMember as the object gives it (``gang_of`` checks it)

    def apply(self, kind: str, obj: Mapping[str, Any]) -> None:
        entry = pod_group_entry(obj)
        metadata = obj.get("metadata") or {}
        key = f"{metadata.get('namespace') or 'default'}/{metadata.get('name') or ''}"
        if kind == "DELETED" or entry is None:
            self.sizes.pop(key, None)
        else:
            self.sizes[entry[0]] = entry[1]


@dataclass(frozen=True)
class GangSettings:
    """``gpuweave extender --gang-ttl S --network-tier-labels a,b,c``; a TTL of 0 turns gang
    placement off (every pod is placed alone)."""

    ttl_s: float = DEFAULT_TTL_S
    tier_labels: tuple[str, ...] = DEFAULT_TIER_LABELS
    clock: Clock = time.monotonic
    pod_groups: PodGroupSizes | None = None  # fed by the PodGroup watch in cluster mode


@dataclass(frozen=True)
class GangAnswer:
    """Filter's answer for a gang member: the one node it may go to, or why none."""

    passed: list[str]
    failed: dict[str, str] = field(default_factory=dict)
    hopeless: dict[str, str] = field(default_factory=dict)


@dataclass
class GangCoordinator:
    cache: ClusterCache
    core: DecisionCore
    book: GangBook = field(default_factory=GangBook)
    tier_labels: Sequence[str] = DEFAULT_TIER_LABELS
    pod_groups: PodGroupSizes = field(default_factory=PodGroupSizes)
    on_outcome: Outcome = lambda _outcome: None
    _sweep_lock: threading.Lock = field(default_factory=threading.Lock)

    def gang_of(self, pod: Mapping[str, Any]) -> Gang | None:
        """The pod's gang; raises ``gangs.BadGangError`` for one it cannot act on (a required tier
        that is not one of ``tier_labels`` among them)."""
        return gang_of(pod, min_members=self.pod_groups.sizes, tier_labels=self.tier_labels)

    # ---- filter -----------------------------------------------------------------------------
    def filter(
        self, gang: Gang, request: PodRequest, names: list[str], host: HostRequest
    ) -> GangAnswer | None:
        """The member's nodes; None when the ordinary path applies (a gang of one, already placed,
        gang complete)."""
        if gang.alone:
            return None
        self.sweep()
        if self.cache.holding(request.uid) is not None:
            return None
        with self.book.lock:
            reservation = self.book.get(gang.key)
            if reservation is None:
                planned = self._plan(gang, request, names, host)
                if not isinstance(planned, Reservation):
                    return planned
                reservation = planned
            self._free_slots_of_gone_members(reservation)
            slot = reservation.claim(request.uid, names)
        if slot is None:
            taken = len(reservation.slots)
            reason = f"gang {gang.key}: all {taken} planned places are claimed by other members"
            return GangAnswer([], hopeless=dict.fromkeys(names, reason))
        return self._steer(gang, slot, request, names, host)

    def _free_slots_of_gone_members(self, reservation: Reservation) -> None:
        """A member deleted before its bind leaves its slot to the pod that replaces it."""
        for slot in reservation.slots:
            member = slot.member
            gone = bool(member) and self.cache.pod_object(uid=member) is None
            if gone and not slot.bound and self.cache.holding(member) is None:  # not mid-bind
                slot.member = ""

    def _plan(
        self, gang: Gang, request: PodRequest, names: list[str], host: HostRequest
    ) -> Reservation | GangAnswer | None:
        needed, placed_nodes = self._placed(gang)
        if needed <= 0:
            return None  # every member is placed: one more pod of the gang is an ordinary pod
        preferred = self.book.last_nodes(gang_family(gang.key))
        outcome = plan_gang(
            key=gang.key,
            needed=needed,
            candidates=names,
            states=self.cache.states(),
            labels=self.cache.node_labels(),
            decide=lambda state: self.core.decide(request, state, host=host),
            tier_labels=self.tier_labels,
            placed_nodes=placed_nodes,
            preferred=preferred,
            required_tier=gang.tier,
        )
        if isinstance(outcome, GangMiss):
            self.on_outcome("missed")
            room = self._room_by_preemption(
                gang, request, names, host, needed=needed, placed_nodes=placed_nodes, preferred=preferred
            )
            if preferred:
                self.book.remember_offered(gang.key, names)
            if room:
                self.book.stop_waiting(gang.key)
                return _room_answer(gang, names, room, dict.fromkeys(names, outcome.reason))
            self.book.wait(gang.key, outcome.closest, cluster_nodes=len(self.cache.states()))
            return GangAnswer([], hopeless=dict.fromkeys(names, outcome.reason))
        self.book.stop_waiting(gang.key)
        self.book.forget_offered(gang.key)
        return self._hold(gang, outcome, request, host)

    def unplaced_alone(
        self,
        gang: Gang,
        request: PodRequest,
        names: list[str],
        host: HostRequest,
        *,
        failed: Mapping[str, str],
        hopeless: Mapping[str, str],
    ) -> GangAnswer | None:
        """Filter's answer for a gang of one that fits none of ``names`` (the ordinary path found
        ``failed`` resolvable, ``hopeless`` not), under the gang rules for preemption: re-created
        after an attempt that ran, the nodes of its room are resolvable and every other node is
        not; any other gang of one gets every node unresolvable, as a gang that never ran. None:
        the ordinary answer stands (not a gang of one, or every node is unresolvable anyway)."""
        if not gang.alone:
            return None
        room: frozenset[str] = frozenset()
        preferred = self.book.last_nodes(gang_family(gang.key))
        if preferred:
            needed, placed_nodes = self._placed(gang)
            self.book.remember_offered(gang.key, names)
            if needed > 0:
                room = self._room_by_preemption(
                    gang, request, names, host, needed=needed, placed_nodes=placed_nodes, preferred=preferred
                )
        if not failed and not room:
            return None
        return _room_answer(gang, names, room, {**hopeless, **failed})

    def bound_alone(self, pod: Mapping[str, Any], node: str) -> None:
        """A pod of a gang bound without a planned slot: a gang of one remembers its node as its
        family's, so its next attempt is a recovering gang's."""
        try:
            gang = self.gang_of(pod)
        except BadGangError:
            return
        if gang is not None and gang.alone:
            self.book.remember_nodes(gang_family(gang.key), (node,))
            self.book.forget_offered(gang.key)

    def _room_by_preemption(
        self,
        gang: Gang,
        request: PodRequest,
        names: list[str],
        host: HostRequest,
        *,
        needed: int,
        placed_nodes: Sequence[str],
        preferred: frozenset[str],
    ) -> frozenset[str]:
        """For a recovering gang (``preferred``: where its last attempt ran) that does not fit:
        the nodes of the domain where it fits once lower-priority pods are gone, each of which
        such an eviction opens for a member. Empty when the gang is not recovering or no
        eviction of lower-priority pods makes it fit."""
        if not preferred:
            return frozenset()
        states = self.cache.states()
        freed: dict[str, NodeState] = {}
        for name in dict.fromkeys(names):
            state = states.get(name)
            if state is None or state.layout is None:
                continue
            victims = [
                r for r in self.cache.holdings_on(name) if evictable(r, request, set(), cache=self.cache)
            ]
            if victims:
                freed[name] = self.core.registry.tokenized(_without_pods(state, victims))
        if not freed:
            return frozenset()
        labels = self.cache.node_labels()
        outcome = plan_gang(
            key=gang.key,
            needed=needed,
            candidates=names,
            states={**states, **freed},
            labels=labels,
            decide=lambda state: self.core.decide(request, state, host=host),
            tier_labels=self.tier_labels,
            placed_nodes=placed_nodes,
            preferred=preferred,
            required_tier=gang.tier,
        )
        if isinstance(outcome, GangMiss):
            return frozenset()
        if outcome.tier >= len(self.tier_labels):  # no labelled domain: only the plan's own nodes
            domain = [s.node for s in outcome.slots if s.node in freed]
        else:
            domain = [
                n
                for n in freed
                if tier_domain(labels.get(n, {}), outcome.tier, tier_labels=self.tier_labels)
                == outcome.domain
            ]
        return frozenset(n for n in domain if self.core.decide(request, freed[n], host=host).fits)

    def preemption_room(
        self, gang: Gang, request: PodRequest, proposed: Sequence[str], host: HostRequest
    ) -> frozenset[str]:
        """The preempt verb's candidates (``proposed``) where evicting lower-priority pods opens a
        place of this recovering gang's plan; empty for a gang that is not recovering, is planned
        already, or fits nowhere even so. Planned over the nodes last offered for it, the nodes
        kube-scheduler nominated for its members (it counts a nominated member there, so it
        neither offers nor proposes that node for the next one) and ``proposed``: kube-scheduler
        offers the extender only nodes its own filters passed, and no node it rejected for
        another reason (a selector, a taint, an unusable network adapter) is planned on. The
        nodes answered here are remembered for the gang's later members (``remember_preempting``):
        the nomination that makes kube-scheduler skip such a node reaches the extender's watch
        after the next member's call may have come."""
        preferred = self.book.last_nodes(gang_family(gang.key))
        if not preferred or self.book.get(gang.key) is not None:
            return frozenset()
        needed, placed_nodes = self._placed(gang)
        if needed <= 0:
            return frozenset()
        candidates = list(
            dict.fromkeys(
                [
                    *self.book.offered(gang.key),
                    *self.book.preempting(gang.key),
                    *self._nominated(gang),
                    *proposed,
                ]
            )
        )
        room = self._room_by_preemption(
            gang,
            request,
            candidates,
            host,
            needed=needed,
            placed_nodes=placed_nodes,
            preferred=preferred,
        )
        allowed = room & frozenset(proposed)
        if allowed:
            self.book.remember_preempting(gang.key, sorted(allowed))
        return allowed

    def _placed(self, gang: Gang) -> tuple[int, list[str]]:
        """(members still to place, nodes of the members placed): bound or mid-bind members."""
        placed = [r for r in self.cache.gang_members(gang.key) if r.node]
        return gang.size - len(placed), sorted({r.node for r in placed if r.node})

    def _nominated(self, gang: Gang) -> list[str]:
        """Nodes kube-scheduler nominated for the gang's pending members (as the cache last saw them)."""
        nodes = []
        for pod in self.cache.pod_objects():
            nominated = (pod.get("status") or {}).get("nominatedNodeName")
            if nominated and not (pod.get("spec") or {}).get("nodeName"):
                try:
                    if (found := self.gang_of(pod)) is not None and found.key == gang.key:
                        nodes.append(str(nominated))
                except BadGangError:
                    continue
        return nodes

    def _hold(
        self, gang: Gang, plan: GangPlan, request: PodRequest, host: HostRequest
    ) -> Reservation | GangAnswer:
        """Hold every slot's devices in the cache, or none of them."""
        slots = [
            Slot(
                holder=f"{SLOT_PREFIX}{gang.key}#{i}",
                node=s.node,
                devices=s.devices,
                cpu_milli=host[0],
                memory_mib=host[1],
            )
            for i, s in enumerate(plan.slots)
        ]
        held: list[Slot] = []
        try:
            for slot in slots:
                self.cache.assume(_slot_record(slot, request))
                held.append(slot)
        except DoubleBookingError as exc:
            for slot in held:
                self.cache.forget(slot.holder)
            reason = f"gang {gang.key}: a planned device was taken meanwhile ({exc}); planning again"
            return GangAnswer([], failed=dict.fromkeys([s.node for s in slots], reason))
        reservation = self.book.new(
            key=gang.key, size=gang.size, slots=slots, tier=plan.tier, domain=plan.domain
        )
        self.book.add(reservation)
        self.on_outcome("planned")
        LOG.info(
            "gang %s: planned %d member(s) on %s (tier %d, domain %r), held for %.0f s",
            gang.key,
            len(slots),
            ",".join(s.node for s in slots),
            plan.tier,
            plan.domain,
            self.book.ttl_s,
        )
        return reservation

    def _steer(
        self, gang: Gang, slot: Slot, request: PodRequest, names: list[str], host: HostRequest
    ) -> GangAnswer:
        elsewhere = f"gang {gang.key}: this member is planned on node {slot.node}"
        others = {n: elsewhere for n in names if n != slot.node}
        if slot.node not in names:
            reason = f"{elsewhere}, which kube-scheduler's own filters did not pass now"
            return GangAnswer([], hopeless=dict.fromkeys(names, reason))
        verdict = self._verdict_in_slot(slot, request, host)
        if not verdict.fits:
            return GangAnswer([], hopeless={**others, slot.node: f"gang {gang.key}: {verdict.reason}"})
        return GangAnswer([slot.node], hopeless=others)

    def _verdict_in_slot(self, slot: Slot, request: PodRequest, host: HostRequest) -> Verdict:
        """The member's verdict on its node with its slot's devices (and host share) free."""
        state = self.cache.node(slot.node)
        if state is None:
            return Verdict(fits=False, reason=f"node {slot.node} left the cache")
        return self.core.decide(request, _without(state, slot), name=slot.node, host=host)

    def keep_places(self, names: list[str], fits: list[bool]) -> list[bool] | None:
        """``fits`` without the nodes kept for waiting gangs, when the pod fits some other node;
        None when nothing changes (no gang waits, or the pod fits only there)."""
        kept = self.book.kept_nodes()
        if not kept:
            return None
        elsewhere = [f and n not in kept for n, f in zip(names, fits, strict=True)]
        if not any(elsewhere) or elsewhere == fits:
            return None
        return elsewhere

    # ---- restart ----------------------------------------------------------------------------
    def rebuild(self) -> int:
        """Once the cache holds the cluster after a (re)start: hold again the places of every gang
        that is partly bound and has a pending member in sight, inside the tightest labelled
        domain its bound members share (kube-scheduler's filters are not known here, so no wider
        set is assumed; a gang with no such domain is planned at its member's next filter).
        Returns the gangs held again."""
        held = 0
        for gang, pod in self._pending_gangs().values():
            request, candidates = self._rebuild_scope(gang, pod)
            if request is None or not candidates:
                continue
            with self.book.lock:
                if self.book.get(gang.key) is None:
                    planned = self._plan(gang, request, candidates, host_requests(pod))
                    held += isinstance(planned, Reservation)
        if held:
            LOG.info("gangs: %d reservation(s) held again after start", held)
        return held

    def _pending_gangs(self) -> dict[str, tuple[Gang, Mapping[str, Any]]]:
        pending: dict[str, tuple[Gang, Mapping[str, Any]]] = {}
        for pod in self.cache.pod_objects():
            if (pod.get("spec") or {}).get("nodeName"):
                continue
            try:
                gang = self.gang_of(pod)
            except BadGangError:
                continue
            if gang is not None and not gang.alone and gang.key not in pending:
                pending[gang.key] = (gang, pod)
        return pending

    def _rebuild_scope(self, gang: Gang, pod: Mapping[str, Any]) -> tuple[PodRequest | None, list[str]]:
        _, placed = self._placed(gang)
        labels = self.cache.node_labels()
        if not placed:
            return None, []
        tier = lowest_common_tier([labels.get(n, {}) for n in placed], tier_labels=self.tier_labels)
        if tier >= len(self.tier_labels):
            return None, []
        label, value = self.tier_labels[tier], labels.get(placed[0], {}).get(self.tier_labels[tier])
        try:
            request = pod_request(pod)
        except BadPodRequestError:
            return None, []
        return request, sorted(n for n, node_labels in labels.items() if node_labels.get(label) == value)

    # ---- bind -------------------------------------------------------------------------------
    def take_slot(self, uid: str, node: str) -> tuple[Reservation, Slot] | None:
        """Release the member's slot on ``node`` so its bind can take the devices (node lock held
        by the caller); ``give_back`` undoes it if the bind fails."""
        found = self.book.slot_of(uid, node)
        if found is not None:
            self.cache.forget(found[1].holder)
        return found

    def give_back(self, taken: tuple[Reservation, Slot], request: PodRequest) -> None:
        try:
            self.cache.assume(_slot_record(taken[1], request))
        except DoubleBookingError:
            LOG.info("gang %s: slot on %s not held again after a failed bind", taken[0].key, taken[1].node)

    def bound(self, taken: tuple[Reservation, Slot]) -> None:
        reservation, slot = taken
        slot.bound = True
        if self.book.finish_if_done(reservation):
            self.on_outcome("completed")
            placed = {r.node for r in self.cache.gang_members(reservation.key) if r.node}
            self.book.remember_nodes(
                gang_family(reservation.key), placed | {s.node for s in reservation.slots}
            )

    # ---- expiry -----------------------------------------------------------------------------
    def sweep(self) -> None:
        """Release every reservation past its TTL: its open slots' devices are free again."""
        if not self._sweep_lock.acquire(blocking=False):
            return
        try:
            for reservation in self.book.expire():
                for slot in reservation.open_slots:
                    self.cache.forget(slot.holder)
                self.on_outcome("expired")
                LOG.info(
                    "gang %s: reservation expired; %d open slot(s) released",
                    reservation.key,
                    len(reservation.open_slots),
                )
        finally:
            self._sweep_lock.release()


def _slot_record(slot: Slot, request: PodRequest) -> PodRecord:
    return PodRecord(
        uid=slot.holder,
        namespace=request.namespace,
        name=slot.holder,
        node=slot.node,
        devices=slot.devices,
        priority=request.priority,
        terminated=False,
        cpu_milli=slot.cpu_milli,
        memory_mib=slot.memory_mib,
    )


def _without_pods(state: NodeState, pods: Sequence[PodRecord]) -> NodeState:
    """The node as it would be once ``pods`` are gone: their devices and host share free."""
    return _without_holders(
        state,
        {p.uid for p in pods},
        cpu_milli=sum(p.cpu_milli for p in pods),
        memory_mib=sum(p.memory_mib for p in pods),
    )


def _without(state: NodeState, slot: Slot) -> NodeState:
    return _without_holders(state, {slot.holder}, cpu_milli=slot.cpu_milli, memory_mib=slot.memory_mib)


def _without_holders(state: NodeState, gone: set[str], *, cpu_milli: int, memory_mib: int) -> NodeState:
    """The node with the devices of the holders in ``gone`` free and their host share back."""
    freed = state.with_holders({d: u for d, u in state.holders.items() if u not in gone})
    if state.host_free is not None and (cpu_milli or memory_mib):
        cpu, memory = state.host_free
        freed = freed.with_host_free((cpu + cpu_milli, memory + memory_mib))
    return freed


def _room_answer(gang: Gang, names: list[str], room: frozenset[str], others: Mapping[str, str]) -> GangAnswer:
    """Filter's answer for a recovering gang (a gang of one too) that fits once lower-priority pods
    are preempted: the nodes of ``room`` resolvable, every other offered node unresolvable with its
    reason in ``others``."""
    reason = (
        f"gang {gang.key} is recovering and fits once pods of lower priority than its "
        f"members on {len(room)} node(s) of its network domain are preempted"
    )
    return GangAnswer(
        [],
        failed={n: reason for n in names if n in room},
        hopeless={n: r for n in names if n not in room and (r := others.get(n)) is not None},
    )
