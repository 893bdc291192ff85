"""The extender's gang verbs: plan a gang when its first member is filtered, steer the others to
their planned nodes, hand a slot to its member at bind, release what expires.

Glue between the pure parts (``gangs`` identity, ``gangs.plan`` planning, ``gangs.book``
reservations) and the cluster cache, which holds every open slot's devices as an assumed
holding, so no other pod can take them and no device is held twice (the cache refuses a double
booking). Nothing survives a restart but what the cluster says: members already bound hold their
devices through their assignment annotations; once the cache is synced, ``rebuild`` holds the
places of partly bound gangs again, and any other member filtered later plans the rest around them.

A gang is planned only once the cache knows all its declared members, and one namespace's open
places hold at most ``HoldLimit`` GPUs (``gangs.limits``); a member that is deleted, so that
fewer pods than the gang declares remain, releases its gang's reservation at once
(``pod_gone``, told by the cache on the watch's delete).

A gang whose family ran and lost a member to a fault or a preemption since is recovering: its
plan prefers where it ran, and where it does not fit it may preempt (``gangs.recovery``,
``Recovery``); a gang of one (``Gang.alone``: ``gpuweave.io/gang`` with size 1) has no plan and
no reservation: filter, prioritize and bind treat it as any pod, its bind remembers its run under
its family (``bound_alone``), and only where it fits no offered node do the recovery rules apply.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from devicemodel.gangs import BadGangError, Gang, gang_of, pod_group_entry
from scheduler_ext.cluster.cache import ClusterCache, DoubleBookingError, PodGone
from scheduler_ext.cluster.objects import PodRecord
from scheduler_ext.decide.core import DecisionCore
from scheduler_ext.decide.state import NodeState
from scheduler_ext.decide.verdict import Verdict
from scheduler_ext.gangs.book import DEFAULT_TTL_S, SLOT_PREFIX, Clock, GangBook, Reservation, Slot
from scheduler_ext.gangs.limits import HoldLimit, gpus_of, missing_members_reason, over_limit_reason
from scheduler_ext.gangs.plan import GangAnswer, GangMiss, GangPlan, plan_gang
from scheduler_ext.gangs.policy import HoldRefused, Taken
from scheduler_ext.gangs.recovery import Recovery, placed_members, room_answer, without_holders
from scheduler_ext.gangs.tier_cost import TierCostSettings
from scheduler_ext.gangs.tier_wait import TierWaits
from scheduler_ext.pods.host import HostRequest, host_requests
from scheduler_ext.pods.requests import BadPodRequestError, PodRequest, pod_request
from scheduler_ext.preflight.book import PreflightBook, PreflightSettings, gpus_of_devices
from topology.network import DEFAULT_TIER_LABELS, lowest_common_tier

LOG = logging.getLogger(__name__)
# planned | missed | expired | completed | incomplete | over-limit | released (the metric)
Outcome = Callable[[str], None]


class PodGroupSizes:
    """``NS/NAME`` -> ``minMember`` of the PodGroups seen (fed by a watch when the CRD exists)."""

    def __init__(self) -> None:
        self.sizes: dict[str, object] = {}  # minMember as the object gives it (``gang_of`` checks it)
        self.uids: dict[str, str] = {}  # the PodGroup's UID: the owner of its gang (``Gang.family``)

    def apply(self, kind: str, obj: Mapping[str, Any]) -> None:
        entry = pod_group_entry(obj)
        metadata = obj.get("metadata") or {}
        key = f"{metadata.get('namespace') or 'default'}/{metadata.get('name') or ''}"
        if kind == "DELETED" or entry is None:
            self.sizes.pop(key, None)
            self.uids.pop(key, None)
        else:
            self.sizes[entry[0]] = entry[1]
            self.uids[entry[0]] = str(metadata.get("uid") or "")


@dataclass(frozen=True)
class GangSettings:
    """``gpuweave extender --gang-ttl S --network-tier-labels a,b,c --gang-hold-per-namespace L``;
    a TTL of 0 turns gang placement off (every pod is placed alone)."""

    ttl_s: float = DEFAULT_TTL_S
    tier_labels: tuple[str, ...] = DEFAULT_TIER_LABELS
    hold_limit: HoldLimit = field(default_factory=HoldLimit)
    clock: Clock = time.monotonic
    pod_groups: PodGroupSizes | None = None  # fed by the PodGroup watch in cluster mode
    preflight: PreflightSettings = field(default_factory=PreflightSettings)  # in cluster mode only
    tier_cost: TierCostSettings = field(default_factory=TierCostSettings)  # wait for the tightest tier?
    wall_clock: Clock = time.time  # pods' start times are Unix seconds (the simulation's own clock)


@dataclass
class GangCoordinator:
    """The gang policy while gang placement is on (``gangs.policy.GangPolicy``: its hooks are the
    public methods here; ``recovery`` answers the two a gang of one and a recovering gang need)."""

    cache: ClusterCache
    core: DecisionCore
    book: GangBook = field(default_factory=GangBook)
    tier_labels: Sequence[str] = DEFAULT_TIER_LABELS
    pod_groups: PodGroupSizes = field(default_factory=PodGroupSizes)
    hold_limit: HoldLimit = field(default_factory=HoldLimit)
    on_outcome: Outcome = lambda _outcome: None
    on_hold_refused: HoldRefused = lambda _request, _reason: None
    preflight: PreflightBook | None = None  # member nodes prove their GPUs before the gang starts
    _sweep_lock: threading.Lock = field(default_factory=threading.Lock)
    tier_waits: TierWaits | None = None  # wait for the tightest tier, or take a looser one now
    recovery: Recovery = field(init=False, repr=False)  # where a recovering gang may preempt

    def __post_init__(self) -> None:
        if self.tier_waits is None:
            self.tier_waits = TierWaits(self.cache, tier_labels=self.tier_labels, clock=self.book.clock)
        self.recovery = Recovery(
            self.cache,
            self.core,
            self.book,
            self.tier_labels,
            self.gang_of,
            wall_clock=self.tier_waits.wall_clock,
        )

    def gang_of(self, pod: Mapping[str, Any]) -> Gang | None:
        """The pod's gang; raises ``gangs.BadGangError`` for one it cannot act on (a required tier
        that is not one of ``tier_labels`` among them)."""
        return gang_of(
            pod,
            min_members=self.pod_groups.sizes,
            tier_labels=self.tier_labels,
            pod_group_uids=self.pod_groups.uids,
        )

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
        waiting = self._preflight(gang, reservation)
        if waiting:  # an error, not a rejection: retried on back-off, whatever other plugins said
            return GangAnswer([], retry=waiting)
        return self._steer(gang, slot, request, names, host)

    def _preflight(self, gang: Gang, reservation: Reservation) -> str:
        """ "" once every member node passed its preflight (or none is needed); else why the member
        waits. A failed preflight releases the plan: the gang is planned again without those nodes."""
        if self.preflight is None or any(s.bound for s in reservation.slots):
            return ""
        nodes: dict[str, set[str]] = {}
        for slot in reservation.slots:
            nodes.setdefault(slot.node, set()).update(gpus_of_devices(slot.devices))
        verdict = self.preflight.check(gang.key, nodes)
        if verdict.state == "failed":
            with self.book.lock:
                if self.book.get(gang.key) is reservation:
                    for slot in reservation.open_slots:
                        self.cache.forget(slot.holder)
                    self.book.drop(gang.key)
            self.preflight.forget(gang.key)
            self.on_outcome("preflight-failed")
            LOG.warning("%s", verdict.reason(gang.key))
        return "" if verdict.state == "passed" else verdict.reason(gang.key)

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
        needed, placed_nodes = placed_members(self.cache, gang)
        if needed <= 0:
            return None  # every member is placed: one more pod of the gang is an ordinary pod
        seen = len(self.cache.gang_member_uids(gang.key))
        if seen < gang.size:  # its members first (``gangs.limits``): nothing planned, nothing held
            self.on_outcome("incomplete")
            reason = missing_members_reason(gang.key, seen=seen, size=gang.size)
            return GangAnswer([], hopeless=dict.fromkeys(names, reason))
        preferred = self.book.recovering_nodes(gang.family)
        avoided = self.preflight.avoided(gang.key) if self.preflight is not None else frozenset()
        candidates = [n for n in names if n not in avoided]
        outcome = plan_gang(
            key=gang.key,
            needed=needed,
            candidates=candidates,
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
            room = self.recovery.room(
                gang, request, names, host, needed=needed, placed_nodes=placed_nodes, preferred=preferred
            )
            if preferred:
                self.book.remember_offered(gang.key, names)
            if room:
                self.book.stop_waiting(gang.key)
                return room_answer(gang, names, room, dict.fromkeys(names, outcome.reason))
            self.book.wait(gang.key, outcome.closest, cluster_nodes=len(self.cache.states()), size=gang.size)
            return GangAnswer([], hopeless=dict.fromkeys(names, outcome.reason))
        waiting = self._wait_for_tighter(gang, request, outcome, names, candidates, placed_nodes=placed_nodes)
        if waiting is not None:
            return waiting
        self.book.stop_waiting(gang.key)
        self.book.forget_offered(gang.key)
        slots = self._slots(gang, outcome, host)
        refused = self._over_limit(gang, request, slots)
        if refused:
            return GangAnswer([], hopeless=dict.fromkeys(names, refused))
        return self._hold(gang, outcome, slots, request)

    def _wait_for_tighter(
        self,
        gang: Gang,
        request: PodRequest,
        plan: GangPlan,
        names: list[str],
        candidates: list[str],
        *,
        placed_nodes: Sequence[str],
    ) -> GangAnswer | None:
        """The answer of a gang that waits for its tightest tier (``gangs.tier_cost``: the wait
        costs less than the looser tier's stretch), keeping that domain's nodes for it; None when
        it takes ``plan`` now. Placed members pin their domain: no choice is left then."""
        if self.tier_waits is None or placed_nodes:
            return None
        pod = self.cache.pod_object(uid=request.uid)
        decided = self.tier_waits.choose(gang, pod, plan, candidates=candidates)
        if decided is None:
            return None
        choice, tight = decided
        text = f"gang {gang.key}: {choice.describe()}"
        LOG.info("%s", text)
        if not choice.wait:
            self.on_outcome("tier-looser")
            return None
        self.on_outcome("tier-waited")
        self.book.wait(gang.key, tight.nodes, cluster_nodes=len(self.cache.states()), size=gang.size)
        return GangAnswer([], hopeless=dict.fromkeys(names, f"{text}; no device is held for it"))

    def _slots(self, gang: Gang, plan: GangPlan, host: HostRequest) -> list[Slot]:
        states = self.cache.states()
        return [
            Slot(
                holder=f"{SLOT_PREFIX}{gang.key}#{i}",
                node=s.node,
                devices=s.devices,
                cpu_milli=host[0],
                memory_mib=host[1],
                gpus=gpus_of(s.devices, states.get(s.node)),
            )
            for i, s in enumerate(plan.slots)
        ]

    def _over_limit(self, gang: Gang, request: PodRequest, slots: Sequence[Slot]) -> str:
        """The reason holding ``slots`` would take the gang's namespace past its limit ("" if not)."""
        want = sum(s.gpus for s in slots)
        held = self.book.held_gpus(request.namespace)
        cluster = self._cluster_gpus()
        if held + want <= self.hold_limit.of(cluster):
            return ""
        self.on_outcome("over-limit")
        reason = over_limit_reason(gang.key, want=want, held=held, limit=self.hold_limit.describe(cluster))
        LOG.info("%s", reason)
        self.on_hold_refused(request, reason)
        return reason

    def _cluster_gpus(self) -> int:
        """GPUs of the nodes with an inventory (the cache's running totals; counted from the nodes'
        layouts where no Node object gave the totals their kind)."""
        total = sum(self.cache.kinds.capacity.values())
        if total:
            return total
        return sum(len(s.layout.gpus) for s in list(self.cache.states().values()) if s.layout is not None)

    def bound_alone(self, pod: Mapping[str, Any], node: str) -> None:
        """A pod of a gang bound without a planned slot: a gang of one remembers its run under its
        family, so its next attempt is a recovering gang's once it is evicted or preempted."""
        try:
            gang = self.gang_of(pod)
        except BadGangError:
            return
        if gang is not None and gang.alone:
            self.book.remember_run(gang.key, gang.family, (node,))
            self.book.forget_offered(gang.key)

    # ---- members gone -------------------------------------------------------------------------
    def pod_gone(self, gone: PodGone) -> None:
        """The cache's ``on_pod_gone``: a bound member ended by a disruption other than
        kube-scheduler's preemption (a fault's eviction, a drain, a node's loss) makes its gang's
        family recovering; a gang left with fewer pods than it declares has its reservation and
        its kept places released at once (the devices are free for the very next decision).

        A member preempted for a higher priority makes nothing recovering: its room went to more
        important work on purpose, and a recovery would let it preempt lower-priority work in turn
        (a chain, each step throwing away the run of pods that had no part in the fault). Its next
        attempt waits as a new gang does."""
        if gone.bound and gone.disrupted:
            self._member_lost(gone)
        with self.book.lock:
            size = self.book.declared_size(gone.gang)
            if not size or len(self.cache.gang_member_uids(gone.gang)) >= size:
                return
            reservation = self.book.drop(gone.gang)
            released = reservation.open_slots if reservation is not None else []
            for slot in released:
                self.cache.forget(slot.holder)
            self.book.stop_waiting(gone.gang)
        if self.tier_waits is not None:
            self.tier_waits.forget(gone.gang)  # a gang of fewer members: its next wait is a new one
        if self.preflight is not None:
            self.preflight.forget(gone.gang)
        self.on_outcome("released")
        LOG.info(
            "gang %s: a member is gone and fewer than its %d members remain; %d open slot(s) and its "
            "kept nodes released",
            gone.gang,
            size,
            len(released),
        )

    def _member_lost(self, gone: PodGone) -> None:
        if gone.preempted:
            LOG.info("gang %s: a member was preempted for a higher priority; not recovering", gone.gang)
        elif self.book.member_lost(gone.gang):
            LOG.info("gang %s: a member was evicted; its next attempt is recovering", gone.gang)

    def _hold(
        self, gang: Gang, plan: GangPlan, slots: list[Slot], request: PodRequest
    ) -> Reservation | GangAnswer:
        """Hold every slot's devices in the cache, or none of them."""
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
            key=gang.key, size=gang.size, slots=slots, tier=plan.tier, domain=plan.domain, family=gang.family
        )
        self.book.add(reservation)
        if self.tier_waits is not None:
            self.tier_waits.forget(gang.key)
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
        """``Recovery.unplaced_alone``: a gang of one that fits no offered node."""
        return self.recovery.unplaced_alone(gang, request, names, host, failed=failed, hopeless=hopeless)

    def preemption_room(
        self, gang: Gang, request: PodRequest, proposed: Sequence[str], host: HostRequest
    ) -> frozenset[str]:
        """``Recovery.preemption_room``: where a recovering gang's member may evict."""
        return self.recovery.preemption_room(gang, request, proposed, host)

    def tell_refused_holds(self, tell: HoldRefused) -> None:
        """Holds refused for a namespace's limit go to ``tell`` (``EventRecorder.gang_hold_refused``)."""
        self.on_hold_refused = tell

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
        _, placed = placed_members(self.cache, gang)
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
    def take_slot(self, uid: str, node: str) -> Taken | None:
        """Release the member's slot on ``node`` so its bind can take the devices (node lock held
        by the caller); ``give_back`` undoes it if the bind fails."""
        found = self.book.slot_of(uid, node)
        if found is not None:
            self.cache.forget(found[1].holder)
        return found

    def give_back(self, taken: Taken, request: PodRequest) -> None:
        """Hold the slot again after its member's bind failed, unless its reservation was released
        or expired meanwhile (nothing would release the slot then)."""
        if not self.book.current(taken[0]):  # no book lock: the caller holds a node lock
            return
        try:
            self.cache.assume(_slot_record(taken[1], request))
        except DoubleBookingError:
            LOG.info("gang %s: slot on %s not held again after a failed bind", taken[0].key, taken[1].node)

    def bound(self, taken: Taken) -> None:
        reservation, slot = taken
        slot.bound = True
        if self.book.finish_if_done(reservation):
            self.on_outcome("completed")
            if self.preflight is not None:
                self.preflight.forget(reservation.key)
            placed = {r.node for r in self.cache.gang_members(reservation.key) if r.node}
            self.book.remember_run(
                reservation.key, reservation.family, placed | {s.node for s in reservation.slots}
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
                if self.preflight is not None:
                    self.preflight.forget(reservation.key)
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


def _without(state: NodeState, slot: Slot) -> NodeState:
    return without_holders(state, {slot.holder}, cpu_milli=slot.cpu_milli, memory_mib=slot.memory_mib)
