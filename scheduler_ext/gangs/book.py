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

A gang that ran before (a recovery: its family's nodes are remembered) and does not fit may
preempt; the book keeps the nodes kube-scheduler last offered for it (``remember_offered``, for
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
MAX_REMEMBERED_GANGS = 10_000  # gang families whose last nodes are remembered (for recovery)

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


@dataclass
class Reservation:
    key: str
    size: int
    slots: list[Slot]
    expires_at: float
    tier: int
    domain: str
    planned_at: float = field(default=0.0)

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
        self._last_nodes: OrderedDict[str, frozenset[str]] = OrderedDict()  # gang family -> its nodes
        self._offered: dict[str, Offered] = {}
        self._preempting: dict[str, Offered] = {}
        self.lock = threading.RLock()  # held across plan + hold, so one gang is planned once

    def get(self, key: str) -> Reservation | None:
        return self._reservations.get(key)

    def add(self, reservation: Reservation) -> None:
        with self.lock:
            self._reservations[reservation.key] = reservation

    def new(self, *, key: str, size: int, slots: list[Slot], tier: int, domain: str) -> Reservation:
        now = self.clock()
        expires = now + self.ttl_s
        return Reservation(key, size, slots, expires_at=expires, tier=tier, domain=domain, planned_at=now)

    def slot_of(self, uid: str, node: str) -> tuple[Reservation, Slot] | None:
        """The open slot a member claimed on ``node`` (its bind takes it over)."""
        with self.lock:
            for reservation in self._reservations.values():
                for slot in reservation.slots:
                    if slot.member == uid and slot.node == node and not slot.bound:
                        return reservation, slot
        return None

    def finish_if_done(self, reservation: Reservation) -> bool:
        """Drop a reservation whose every slot is bound; True when it was dropped."""
        with self.lock:
            if all(s.bound for s in reservation.slots):
                self._reservations.pop(reservation.key, None)
                return True
        return False

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

    def wait(self, key: str, nodes: Sequence[str], *, cluster_nodes: int) -> bool:
        """Keep ``nodes`` for waiting gang ``key`` for the TTL (renewed by each of its tries).
        Refused (False, nothing kept) when every waiting gang's nodes together would exceed
        ``WAITING_SHARE`` of the cluster's nodes, or there is nothing to keep."""
        with self.lock:
            self._waiting.pop(key, None)
            kept = _union(self._waiting.values()) | frozenset(nodes)
            if nodes and len(kept) <= WAITING_SHARE * cluster_nodes:
                self._waiting[key] = Waiting(key, frozenset(nodes), self.clock() + self.ttl_s)
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

    def remember_nodes(self, family: str, nodes: Iterable[str]) -> None:
        """Where a gang (family: ``gangs.gang_family``) ran, for the plan of its next attempt."""
        with self.lock:
            self._last_nodes[family] = frozenset(nodes)
            self._last_nodes.move_to_end(family)
            while len(self._last_nodes) > MAX_REMEMBERED_GANGS:
                self._last_nodes.popitem(last=False)

    def last_nodes(self, family: str) -> frozenset[str]:
        return self._last_nodes.get(family, frozenset())

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
