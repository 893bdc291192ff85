"""The cluster cache: nodes, their inventories, and which pod holds which device.

A node is in the cache while its Node object is: a ``GpuNodeInventory`` whose Node is gone (a
scale-down, before the garbage collector deletes the inventory with its Node, or with an agent
that set no owner reference) or not listed yet is kept aside and counts for nothing, not in
decisions, gangs, Kueue's checks, ``gpuweave status`` nor the capacity metrics, until a Node of
that name is there.

Reads take no lock: each node's ``NodeState`` is an immutable value replaced wholesale on change
(copy-on-write), and a dict lookup of it is atomic. Writes to one node's state go through that
node's lock, so binds on different nodes never wait for each other.

Pod assignment annotations are the source of truth for who holds what, as far as the pod could
really hold those devices (``objects``: bound, up to its requests); between a bind and the watch
delivering the annotated pod, the bind's allocation is *assumed* so concurrent decisions never
double-book. Pods that leave the cache (deleted, or ended) are told to ``on_pod_gone`` with the
gang they named and whether a disruption ended them (``objects.pod_disrupted``): the gangs release
what they held for members that are gone, and remember a member lost to a fault or a preemption.
Two counted pods naming one device (a forged annotation on a bound pod, a second
extender binding in the same cluster) are a conflict: the device stays with the pod the cache
counted first, the later pod does not hold it, and ``on_conflict`` is told once per pod and device
(the extender wires a metric, an Event and a log line to it). A restart rebuilds everything from
the API (or the snapshot).
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from devicemodel.errors import GpuweaveError, InvalidInputError
from devicemodel.spec_templates import SpecTemplates
from scheduler_ext.cluster.claims import ClaimBook
from scheduler_ext.cluster.objects import (
    InventoryRecord,
    PodRecord,
    inventory_record,
    pod_record,
)
from scheduler_ext.cluster.pod_objects import PodObjects
from scheduler_ext.decide.by_state import TokenIndex
from scheduler_ext.decide.registry import LayoutRegistry
from scheduler_ext.decide.reservation import KindTotals, kind_and_free
from scheduler_ext.decide.state import NodeState
from scheduler_ext.pods.host import host_allocatable
from topology.network import DEFAULT_TIER_LABELS

LOG = logging.getLogger(__name__)
# (the later pod, the device, the UID of the pod that keeps it): called once per pod and device
ConflictHook = Callable[[PodRecord, str, str], None]


class DoubleBookingError(GpuweaveError):
    """A bind would hand out a device another pod holds."""


@dataclass(frozen=True)
class PodGone:
    """A pod that left the cache: deleted, or ended (``on_pod_gone``)."""

    uid: str
    gang: str  # the gang key it named ("" for none)
    bound: bool  # it held devices as a bound pod (not only assumed at bind)
    disrupted: bool  # an eviction or a preemption ended it (``objects.pod_disrupted``)
    preempted: bool = False  # that was kube-scheduler's preemption (``objects.pod_preempted``)


PodGoneHook = Callable[[PodGone], None]


@dataclass(frozen=True)
class Holding:
    """A pod's devices on one node; ``assumed`` until the watch shows the annotation."""

    record: PodRecord
    assumed: bool


class ClusterCache:
    """Thread-safe; see module doc for the locking model."""

    def __init__(self, registry: LayoutRegistry, *, label_keys: Sequence[str] = DEFAULT_TIER_LABELS) -> None:
        """``label_keys``: the node labels kept per node (the network tiers gangs are placed by)."""
        self.registry = registry
        self._label_keys = tuple(label_keys)
        self._labels: dict[str, Mapping[str, str]] = {}  # node -> its labels among ``label_keys``
        self._states: dict[str, NodeState] = {}
        self._tokens = TokenIndex()  # name -> its state's memo token, for bulk lookups (``by_state``)
        self._bases: dict[str, NodeState] = {}  # per node: layout, identifiers and health, no holders
        self._known_nodes: set[str] = set()
        self._holdings: dict[str, Holding] = {}  # pod UID -> devices held
        self._since: dict[str, int] = {}  # pod UID -> when it first held devices (conflict order)
        self._sequence = itertools.count()
        self._conflicts: dict[str, set[str]] = {}  # pod UID -> its devices reported as conflicts
        self.on_conflict: ConflictHook | None = None
        self.on_pod_gone: PodGoneHook | None = None  # called with no cache lock held
        self._by_node: dict[str, set[str]] = {}  # node -> UIDs holding devices there
        self._by_gang: dict[str, dict[str, None]] = {}  # gang key -> UIDs of its members holding devices
        self._pods = PodObjects()  # pending pods' objects (and, offline, bound ones), by UID
        self._allocatable: dict[str, tuple[int, int]] = {}  # node -> host (CPU milli, memory MiB)
        self._host_use: dict[str, PodRecord] = {}  # pod UID -> its host requests, bound pods only
        self._host_by_node: dict[str, set[str]] = {}
        self._spec_templates = SpecTemplates()  # one full parse per hardware shape (``spec_templates``)
        self._kinds = KindTotals()  # free GPU capacity by node kind, for reservation (``reservation``)
        self._node_locks: dict[str, threading.RLock] = {}
        self._meta_lock = threading.Lock()  # guards the lock table and pod bookkeeping only
        self.claims = ClaimBook()  # ResourceClaims and gpuweave.io ResourceSlices (DRA pods' scores)
        self.synced = threading.Event()

    # ---- reads (no lock) ----------------------------------------------------------------------
    def node(self, name: str) -> NodeState | None:
        return self._states.get(name)

    def states(self) -> Mapping[str, NodeState]:
        """The live name -> state map, for lock-free bulk lookups (do not mutate)."""
        return self._states

    def tokens(self) -> Mapping[str, int]:
        """The live name -> memo token map (do not mutate)."""
        return self._tokens.mapping()

    def token_keys(self, names: list[str]) -> np.ndarray:
        """The names' memo tokens as int64, -1 for a name not in the cache (``by_state``)."""
        return self._tokens.keys(names)

    def node_names(self) -> list[str]:
        return list(self._states)

    def pod_object(self, *, uid: str = "", key: str = "") -> Mapping[str, Any] | None:
        return self._pods.get(uid=uid, key=key)

    def pod_objects(self) -> list[Mapping[str, Any]]:
        """Pending pods seen, plus bound ones a snapshot binder keeps (with their annotation)."""
        return self._pods.all()

    def gang_member_uids(self, key: str) -> set[str]:
        """The pods of gang ``key`` the cache knows: pending ones (their objects) and those holding
        devices (bound, or assumed at bind). A gang is planned only once these are all its members."""
        return {*self._pods.of_gang(key), *list(self._by_gang.get(key, ()))}

    def holdings_on(self, node: str) -> list[PodRecord]:
        holdings = (self._holdings.get(uid) for uid in list(self._by_node.get(node, ())))
        return [h.record for h in holdings if h is not None]

    def holding(self, uid: str) -> Holding | None:
        return self._holdings.get(uid)

    def gang_members(self, key: str) -> list[PodRecord]:
        """Pods of gang ``key`` that hold devices (bound, or assumed at bind), in holding order."""
        holdings = (self._holdings.get(uid) for uid in list(self._by_gang.get(key, ())))
        return [h.record for h in holdings if h is not None and h.record.gang == key]

    def node_labels(self) -> Mapping[str, Mapping[str, str]]:
        """The live node -> tier labels map (only nodes carrying one; do not mutate)."""
        return self._labels

    def node_lock(self, name: str) -> threading.RLock:
        lock = self._node_locks.get(name)
        if lock is None:
            with self._meta_lock:
                lock = self._node_locks.setdefault(name, threading.RLock())
        return lock

    # ---- nodes and inventories ----------------------------------------------------------------
    def upsert_node(self, obj: Mapping[str, Any]) -> None:
        metadata = obj.get("metadata") or {}
        name = str(metadata.get("name") or "")
        if not name:
            return
        self._keep_labels(name, metadata.get("labels"))
        allocatable = host_allocatable(obj)
        if name in self._known_nodes and allocatable in (None, self._allocatable.get(name)):
            return  # a status heartbeat or a label change: nothing a decision reads has changed
        self._known_nodes.add(name)
        if allocatable is not None:
            self._allocatable[name] = allocatable
        self._rebuild(name)

    def _keep_labels(self, name: str, labels: object) -> None:
        kept = (
            {k: str(labels[k]) for k in self._label_keys if isinstance(labels.get(k), str)}
            if isinstance(labels, Mapping)
            else {}
        )
        if kept:
            if self._labels.get(name) != kept:
                self._labels[name] = kept
        else:
            self._labels.pop(name, None)

    def delete_node(self, name: str) -> None:
        self._labels.pop(name, None)
        self._known_nodes.discard(name)
        self._allocatable.pop(name, None)
        self._rebuild(name)

    def upsert_inventory(self, obj: Mapping[str, Any]) -> None:
        try:
            record = inventory_record(obj, templates=self._spec_templates)
        except InvalidInputError as exc:
            LOG.warning("ignoring GpuNodeInventory: %s", exc)
            return
        self.put_inventory(record)

    def put_inventory(self, record: InventoryRecord) -> None:
        """Install an already-parsed inventory (benchmarks and what-if runs skip the CR round trip)."""
        self._bases[record.node] = _base_state(self.registry, record)
        self._rebuild(record.node)

    def delete_inventory(self, name: str) -> None:
        self._bases.pop(name, None)
        self._rebuild(name)

    # ---- pods -----------------------------------------------------------------------------------
    def remember_pod(self, obj: Mapping[str, Any]) -> None:
        """Keep a pending pod's object so a later bind (which names it only) can be decided."""
        self._pods.put(obj)

    def upsert_pod(self, obj: Mapping[str, Any]) -> None:
        record = pod_record(obj)
        if record.terminated:
            self.delete_pod(record.uid, disrupted=record.disrupted, preempted=record.preempted)
            return
        host_changed: set[str] = set()
        if record.node is None:
            self.remember_pod(obj)  # pending: a bind may name it next
        else:
            self._drop_object(record.uid)  # bound: the API (or the snapshot) holds it, not us
            host_changed = self._put_host_use(record.uid, record)
        if self._confirm(record):
            for node in sorted(host_changed):  # none: the assumed record counted the same use
                self._rebuild(node)
            return
        previous = self._holdings.get(record.uid)
        rebuilt: set[str] = set()
        if record.devices or (previous is not None and not previous.assumed):
            # an assumed bind stays until the annotation (or the pod's end) arrives
            rebuilt = self._set_holding(
                record.uid, Holding(record, assumed=False) if record.devices else None
            )
        for node in sorted(host_changed - rebuilt):
            self._rebuild(node)

    def _confirm(self, record: PodRecord) -> bool:
        """The watch shows a holding as the cache has it (same node, devices, requests): an
        assumed one stops being assumed, the record's start time and expected run (not part of its
        equality) are kept, and the node's state, whose holders are the same, is not rebuilt.
        Every bind's annotated pod arrives this way once, and so does each later update that
        changes no part of the record (the kubelet's status updates, a delete's grace period
        starting)."""
        if record.node is None or not record.devices:
            return False
        with self.node_lock(record.node):
            previous = self._holdings.get(record.uid)
            if previous is None or previous.record != record:
                return False
            self._holdings[record.uid] = Holding(record, assumed=False)  # its start time, once known
            return True

    def delete_pod(self, uid: str, *, disrupted: bool = False, preempted: bool = False) -> None:
        """The pod is gone (the watch's delete, or its end); ``disrupted``: the deleted object says
        an eviction or a preemption ended it (``objects.pod_disrupted``), ``preempted``: that it
        was kube-scheduler's preemption (``objects.pod_preempted``)."""
        holding = self._holdings.get(uid)
        gang = self._pods.gang_of(uid) or (holding.record.gang if holding is not None else "")
        self._drop_object(uid)
        host_changed = self._put_host_use(uid, None)
        for node in sorted(host_changed - self._set_holding(uid, None)):
            self._rebuild(node)
        if gang and self.on_pod_gone is not None:
            bound = holding is not None and not holding.assumed
            record = holding.record if holding is not None else None
            ended = disrupted or (record is not None and record.disrupted)
            preempted = preempted or (record is not None and record.preempted)
            self.on_pod_gone(PodGone(uid=uid, gang=gang, bound=bound, disrupted=ended, preempted=preempted))

    def _put_host_use(self, uid: str, record: PodRecord | None) -> set[str]:
        """Count a bound pod's CPU and memory on its node (any pod: kube-scheduler binds most);
        returns the nodes whose host use changed (the caller rebuilds them)."""
        previous = self._host_use.get(uid)
        counted = (
            record if record is not None and record.node and (record.cpu_milli or record.memory_mib) else None
        )
        if _host_key(previous) == _host_key(counted):
            return set()
        with self._meta_lock:
            if previous is not None:
                self._host_use.pop(uid, None)
                self._host_by_node.get(previous.node or "", set()).discard(uid)
            if counted is not None and counted.node:
                self._host_use[uid] = counted
                self._host_by_node.setdefault(counted.node, set()).add(uid)
        return {r.node for r in (previous, counted) if r is not None and r.node}

    def _drop_object(self, uid: str) -> None:
        self._pods.drop(uid)

    def assume(self, record: PodRecord) -> None:
        """Record a bind's devices before the API shows them; raises ``DoubleBookingError``."""
        assert record.node is not None
        with self.node_lock(record.node):
            state = self._states.get(record.node)
            holders = state.holders if state is not None else {}
            clash = sorted(d for d in record.devices if holders.get(d, record.uid) != record.uid)
            if clash:
                raise DoubleBookingError(
                    f"pod {record.key} would take devices {', '.join(clash)} on node {record.node} "
                    "that other pods hold; kube-scheduler will retry the pod"
                )
            self._put_holding(record.uid, Holding(record, assumed=True))
            elsewhere = self._put_host_use(record.uid, record) - {record.node}
            self._rebuild_locked(record.node)
        for node in sorted(elsewhere):
            self._rebuild(node)

    def forget(self, uid: str) -> None:
        """Drop an assumed holding whose bind failed."""
        holding = self._holdings.get(uid)
        if holding is not None and holding.assumed:
            host_changed = self._put_host_use(uid, None)
            for node in sorted(host_changed - self._set_holding(uid, None)):
                self._rebuild(node)

    def _set_holding(self, uid: str, holding: Holding | None) -> set[str]:
        """Replace the pod's holding; returns the nodes rebuilt."""
        previous = self._holdings.get(uid)
        nodes = {h.record.node for h in (previous, holding) if h is not None and h.record.node}
        for node in sorted(n for n in nodes if n):
            with self.node_lock(node):
                self._put_holding(uid, holding)
                self._rebuild_locked(node)
        return {n for n in nodes if n}

    def _put_holding(self, uid: str, holding: Holding | None) -> None:
        previous = self._holdings.pop(uid, None)
        if previous is not None and previous.record.node:
            self._by_node.get(previous.record.node, set()).discard(uid)
        if previous is not None and previous.record.gang:
            members = self._by_gang.get(previous.record.gang)
            if members is not None:
                members.pop(uid, None)
                if not members:
                    self._by_gang.pop(previous.record.gang, None)
        if holding is not None and holding.record.node:
            self._holdings[uid] = holding
            self._by_node.setdefault(holding.record.node, set()).add(uid)
            if holding.record.gang:
                self._by_gang.setdefault(holding.record.gang, {})[uid] = None
            with self._meta_lock:
                self._since.setdefault(uid, next(self._sequence))
        else:
            with self._meta_lock:
                self._since.pop(uid, None)
                self._conflicts.pop(uid, None)

    # ---- state rebuild --------------------------------------------------------------------------
    def _rebuild(self, name: str) -> None:
        with self.node_lock(name):
            self._rebuild_locked(name)

    def _rebuild_locked(self, name: str) -> None:
        base = self._bases.get(name)
        if name not in self._known_nodes:  # no Node (deleted, or not listed yet): its inventory is kept aside
            self._states.pop(name, None)
            self._tokens.drop(name)
            self._kinds.put(name, None, 0, 0.0)
            return
        holders = self._holders(self.holdings_on(name))
        if base is None:
            state = self.registry.tokenized(NodeState(name=name, holders=holders))
        else:
            state = self.registry.tokenized(base.with_holders(holders).with_host_free(self._host_free(name)))
        self._states[name] = state
        self._tokens.set(name, state.token)
        self._kinds.put(name, *kind_and_free(state, self._allocatable.get(name)))

    def _holders(self, records: Iterable[PodRecord]) -> dict[str, str]:
        """Device -> the pod that holds it; of two pods naming one device, the one counted first."""
        holders: dict[str, str] = {}
        since = self._since
        for record in sorted(records, key=lambda r: (since.get(r.uid, -1), r.uid)):
            for device in record.devices:
                holder = holders.setdefault(device, record.uid)
                if holder != record.uid:
                    self._conflict(record, device, holder)
        return holders

    def _conflict(self, record: PodRecord, device: str, holder: str) -> None:
        with self._meta_lock:
            reported = self._conflicts.setdefault(record.uid, set())
            if device in reported:
                return
            reported.add(device)
        LOG.warning(
            "pod %s (uid %s) on node %s names device %s, which pod uid %s holds; not counting it for %s",
            record.key,
            record.uid,
            record.node,
            device,
            holder,
            record.key,
        )
        if self.on_conflict is not None:
            self.on_conflict(record, device, holder)

    @property
    def kinds(self) -> KindTotals:
        return self._kinds

    def _host_free(self, name: str) -> tuple[int, int] | None:
        allocatable = self._allocatable.get(name)
        if allocatable is None:
            return None
        users = [self._host_use.get(uid) for uid in list(self._host_by_node.get(name, ()))]
        cpu = sum(r.cpu_milli for r in users if r is not None)
        memory = sum(r.memory_mib for r in users if r is not None)
        return allocatable[0] - cpu, allocatable[1] - memory


def _host_key(record: PodRecord | None) -> tuple[str | None, int, int] | None:
    return None if record is None else (record.node, record.cpu_milli, record.memory_mib)


def _base_state(registry: LayoutRegistry, record: InventoryRecord) -> NodeState:
    return registry.node_state(
        record.inventory, name=record.node, sharing=record.sharing, unhealthy=record.unhealthy
    )
