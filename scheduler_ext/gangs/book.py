"""Gang reservations: the planned places of a gang's members, held until they bind or expire.

A reservation is the answer of ``gangs.plan`` kept for ``ttl_s``: one slot per member not yet
placed, each a node and the devices planned there. The cluster cache holds each slot's devices
as an *assumed* holding under the slot's own holder ID (``gang-slot:KEY#i``), so every other
pod's filter and bind see them taken; a member's bind hands the slot's holding over to the
member. Slots are claimed by members in the order they are filtered: a member keeps the slot it
claimed, so kube-scheduler's retries of it are steered to the same node, unless that node is no
longer offered for it and a free slot's node is (members pinned to other nodes trade places).

A gang that does not fit keeps its place instead (``wait``): the nodes with room in the domain
closest to holding it are kept from pods that fit elsewhere, for the TTL after each of its
tries, and all waiting gangs together keep at most ``WAITING_SHARE`` of the nodes.

The book remembers where each gang *family* (``Gang.family``: the job's name without its restart
attempt, its size and its owner) last ran, and whether it has since lost a member to a fault or
a preemption (``member_lost``, from a bound member's disrupted end). Only such a family is
*recovering* (``recovering_nodes``): the plan of its next attempt prefers its nodes, and it may
preempt when it does not fit. A gang that ran and ended, or another job reusing the name with
another size or owner, is a new gang. The book keeps the nodes kube-scheduler last offered for a
recovering gang (``remember_offered``, for
the TTL) and the nodes the preempt verb let a member preempt on (``remember_preempting``, for the
TTL), which with the preempt call's candidates make the nodes its preemption is planned on.

The book keeps only reservations and time (a clock passed in, a fake one in tests); the cache
calls are the coordinator's (``gangs.service``). Thread-safe.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

DEFAULT_TTL_S = 60.0
SLOT_PREFIX = "gang-slot:"
WAITING_SHARE = 0.25  # nodes kept for waiting gangs, all together, at most this share of the cluster
MAX_REMEMBERED_GANGS = 10_000  # gang families whose last run is remembered (for recovery)

Clock = Callable[[], float]


@dataclass
class Slot:
    """One member's planned place; ``member`` is the UID of the pod that claimed it ("" free)."""

    holder: str  # the holder ID of its devices in the cache
    node: str
    devices: frozenset[str]
    cpu_milli: int = 0
    memory_mib: int = 0
    member: str = ""
    bound: bool = False
    gpus: int = 0  # the GPUs its devices are on (whole or in part): what the namespace's limit counts


@dataclass
class Reservation:
    key: str
    size: int
    slots: list[Slot]
    expires_at: float
    tier: int
    domain: str
    planned_at: float = field(default=0.0)
    family: str = ""  # ``Gang.family``: what its run is remembered under

    @property
    def namespace(self) -> str:
        return self.key.partition("/")[0]

    def claim(self, uid: str, offered: Sequence[str]) -> Slot | None:
        """The member's slot: the one it claimed before, unless that node is not offered now and a
        free slot's node is (members pinned to other nodes trade places); else a free slot, on an
        offered node first. None when every slot is another member's."""
        names = set(offered)
        mine = next((s for s in self.slots if s.member == uid), None)
        if mine is not None and (mine.bound or mine.node in names):
            return mine
        free = [s for s in self.slots if not s.member]
        better = next((s for s in free if s.node in names), None)
        if mine is not None:
            if better is None:
                return mine
            mine.member = ""
        slot = better or (free[0] if free else None)
        if slot is not None:
            slot.member = uid
        return slot

    @property
    def open_slots(self) -> list[Slot]:
        """Slots still holding devices in the cache (not yet handed to a bound member)."""
        return [s for s in self.slots if not s.bound]


@dataclass(frozen=True)
class Waiting:
    """Nodes kept for a gang that did not fit: only pods that fit nowhere else go there."""

    key: str
    nodes: frozenset[str]
    until: float
    size: int = 0  # the members the gang declares


@dataclass(frozen=True)
class Ran:
    """Where a gang family last ran, and whether it lost a member to a fault or preemption since."""

    nodes: frozenset[str]
    lost: bool = False


@dataclass(frozen=True)
class Offered:
    """The nodes kube-scheduler last offered for a recovering gang's member, until ``until``."""

    key: str
    nodes: tuple[str, ...]
    until: float


class GangBook:
    """Reservations by gang key, with their expiry; and the places kept for waiting gangs."""

    def __init__(self, *, ttl_s: float = DEFAULT_TTL_S, clock: Clock = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        self._reservations: dict[str, Reservation] = {}
        self._waiting: dict[str, Waiting] = {}
        self._kept: frozenset[str] = frozenset()  # every waiting gang's nodes (read without a lock)
        self._ran: OrderedDict[str, Ran] = OrderedDict()  # gang family -> its last run
        self._family_of: OrderedDict[str, str] = OrderedDict()  # gang key that ran -> its family
        self._offered: dict[str, Offered] = {}
        self._preempting: dict[str, Offered] = {}
        self.lock = threading.RLock()  # held across plan + hold, so one gang is planned once

    def get(self, key: str) -> Reservation | None:
        return self._reservations.get(key)

    def add(self, reservation: Reservation) -> None:
        with self.lock:
            self._reservations[reservation.key] = reservation

    def new(
        self, *, key: str, size: int, slots: list[Slot], tier: int, domain: str, family: str = ""
    ) -> Reservation:
        now = self.clock()
        expires = now + self.ttl_s
        return Reservation(
            key, size, slots, expires_at=expires, tier=tier, domain=domain, planned_at=now, family=family
        )

    def drop(self, key: str) -> Reservation | None:
        """Remove and return gang ``key``'s reservation (the caller releases its open slots)."""
        with self.lock:
            return self._reservations.pop(key, None)

    def declared_size(self, key: str) -> int:
        """The members gang ``key`` declares, where the book holds or keeps anything for it; else 0."""
        with self.lock:
            reservation, waiting = self._reservations.get(key), self._waiting.get(key)
        return reservation.size if reservation is not None else waiting.size if waiting is not None else 0

    def held_gpus(self, namespace: str) -> int:
        """GPUs the open slots of ``namespace``'s reservations hold (the namespace's limit counts them)."""
        return sum(
            s.gpus for r in self.reservations() if r.namespace == namespace for s in r.open_slots
        )

    def slot_of(self, uid: str, node: str) -> tuple[Reservation, Slot] | None:
        """The open slot a member claimed on ``node`` (its bind takes it over). Takes no lock: the
        bind calls it under a node lock, and planning holds ``lock`` while it takes node locks,
        so waiting for ``lock`` here could deadlock the two (``list`` copies the values at once)."""
        for reservation in list(self._reservations.values()):
            for slot in reservation.slots:
                if slot.member == uid and slot.node == node and not slot.bound:
                    return reservation, slot
        return None

    def finish_if_done(self, reservation: Reservation) -> bool:
        """Drop a reservation whose every slot is bound; True when it was dropped."""
        with self.lock:
            if all(s.bound for s in reservation.slots):
                if self._reservations.get(reservation.key) is reservation:
                    del self._reservations[reservation.key]
                return True
        return False

    def current(self, reservation: Reservation) -> bool:
        """Whether ``reservation`` is still held (not expired, released or done)."""
        return self._reservations.get(reservation.key) is reservation

    def expire(self) -> list[Reservation]:
        """Remove and return every reservation past its expiry (the caller releases its slots);
        drop the places kept for waiting gangs whose last try is older than the TTL."""
        now = self.clock()
        with self.lock:
            gone = [r for r in self._reservations.values() if r.expires_at <= now]
            for reservation in gone:
                del self._reservations[reservation.key]
            self._offered = _unexpired(self._offered, now)
            self._preempting = _unexpired(self._preempting, now)
            if any(w.until <= now for w in self._waiting.values()):
                self._waiting = {k: w for k, w in self._waiting.items() if w.until > now}
                self._kept = _union(self._waiting.values())
        return gone

    def wait(self, key: str, nodes: Sequence[str], *, cluster_nodes: int, size: int = 0) -> bool:
        """Keep ``nodes`` for waiting gang ``key`` for the TTL (renewed by each of its tries).
        Refused (False, nothing kept) when every waiting gang's nodes together would exceed
        ``WAITING_SHARE`` of the cluster's nodes, or there is nothing to keep."""
        with self.lock:
            self._waiting.pop(key, None)
            kept = _union(self._waiting.values()) | frozenset(nodes)
            if nodes and len(kept) <= WAITING_SHARE * cluster_nodes:
                self._waiting[key] = Waiting(key, frozenset(nodes), self.clock() + self.ttl_s, size)
            self._kept = _union(self._waiting.values())
            return key in self._waiting

    def stop_waiting(self, key: str) -> None:
        if key in self._waiting:
            with self.lock:
                self._waiting.pop(key, None)
                self._kept = _union(self._waiting.values())

    def remember_offered(self, key: str, nodes: Sequence[str]) -> None:
        """The nodes kube-scheduler offered for recovering gang ``key`` (kept for the TTL)."""
        with self.lock:
            self._offered[key] = Offered(key, tuple(nodes), self.clock() + self.ttl_s)

    def forget_offered(self, key: str) -> None:
        """Forget the nodes offered and preempted on for gang ``key`` (it is planned now)."""
        if key in self._offered or key in self._preempting:
            with self.lock:
                self._offered.pop(key, None)
                self._preempting.pop(key, None)

    def remember_preempting(self, key: str, nodes: Iterable[str]) -> None:
        """Nodes the preempt verb let a member of gang ``key`` preempt on, added to those kept
        (the TTL renewed). kube-scheduler nominates the member there, but the extender sees the
        nomination only when the watch brings it, and the next member's preempt call may come
        first: without these, that member's plan would miss the node its gang is opening."""
        with self.lock:
            merged = tuple(dict.fromkeys([*self.preempting(key), *nodes]))
            self._preempting[key] = Offered(key, merged, self.clock() + self.ttl_s)

    def preempting(self, key: str) -> tuple[str, ...]:
        """The nodes kept by ``remember_preempting`` (empty: none, or older than the TTL)."""
        return self._live(self._preempting, key)

    def offered(self, key: str) -> tuple[str, ...]:
        """The nodes last offered for gang ``key`` (empty: none, or older than the TTL)."""
        return self._live(self._offered, key)

    def _live(self, table: dict[str, Offered], key: str) -> tuple[str, ...]:
        with self.lock:
            entry = table.get(key)
            return entry.nodes if entry is not None and entry.until > self.clock() else ()

    def kept_nodes(self) -> frozenset[str]:
        """Nodes kept for waiting gangs now (lock-free: the hot path of every filter reads it)."""
        return self._kept

    def waiting(self) -> list[Waiting]:
        with self.lock:
            return list(self._waiting.values())

    def remember_run(self, key: str, family: str, nodes: Iterable[str]) -> None:
        """Gang ``key`` of ``family`` (``Gang.family``) runs on ``nodes``: every member bound. A
        loss of one of its members later makes the family recovering (``member_lost``)."""
        with self.lock:
            self._ran[family] = Ran(frozenset(nodes))
            self._ran.move_to_end(family)
            self._family_of[key] = family
            self._family_of.move_to_end(key)
            for table in (self._ran, self._family_of):
                while len(table) > MAX_REMEMBERED_GANGS:
                    table.popitem(last=False)

    def member_lost(self, key: str) -> bool:
        """A bound member of gang ``key`` was ended by a fault or a preemption: if the gang ran,
        its family is recovering from now on (until it runs again). True when it ran."""
        with self.lock:
            family = self._family_of.get(key)
            ran = self._ran.get(family) if family is not None else None
            if family is None or ran is None:
                return False
            self._ran[family] = Ran(ran.nodes, lost=True)
            return True

    def last_nodes(self, family: str) -> frozenset[str]:
        """Where ``family`` last ran (empty: not remembered)."""
        ran = self._ran.get(family)
        return ran.nodes if ran is not None else frozenset()

    def recovering_nodes(self, family: str) -> frozenset[str]:
        """Where ``family`` last ran, when it lost a member to a fault or a preemption since; empty
        for a family that is not recovering (never ran, or ran and ended on its own)."""
        ran = self._ran.get(family)
        return ran.nodes if ran is not None and ran.lost else frozenset()

    def recovering(self) -> int:
        """How many families are recovering now (the metric)."""
        with self.lock:
            return sum(1 for ran in self._ran.values() if ran.lost)

    def reservations(self) -> list[Reservation]:
        with self.lock:
            return list(self._reservations.values())

    def held_devices(self) -> int:
        """Devices held by open slots (the metric)."""
        return sum(len(s.devices) for r in self.reservations() for s in r.open_slots)


def _unexpired(table: dict[str, Offered], now: float) -> dict[str, Offered]:
    """``table`` without its entries past their time (the same dict when none is)."""
    if all(o.until > now for o in table.values()):
        return table
    return {k: o for k, o in table.items() if o.until > now}


def _union(waiting: Iterable[Waiting]) -> frozenset[str]:
    nodes: set[str] = set()
    for entry in waiting:
        nodes |= entry.nodes
    return frozenset(nodes)
