"""The pod objects the cache keeps whole: pending pods (a later bind names them only; a gang is
planned only once its members exist), and, offline, bound ones a snapshot binder keeps.

At most ``MAX_REMEMBERED_PODS`` are kept (the one seen longest ago goes first), indexed by
``namespace/name`` and by the gang key each names (``gangs.gang_key``), so counting a gang's
members costs the gang's size, not the cluster's pods. Thread-safe: one lock, held for
dictionary updates only.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from devicemodel.gangs import gang_key
from scheduler_ext.cluster.objects import pod_identity

MAX_REMEMBERED_PODS = 20_000


class PodObjects:
    """UID -> the last object seen of each kept pod, with the name and gang indexes."""

    def __init__(self, *, limit: int = MAX_REMEMBERED_PODS) -> None:
        self._limit = limit
        self._pods: OrderedDict[str, Mapping[str, Any]] = OrderedDict()  # UID -> last seen pod object
        self._uids: dict[str, str] = {}  # namespace/name -> UID
        self._gang_of: dict[str, str] = {}  # UID -> the gang key its object names
        self._by_gang: dict[str, dict[str, None]] = {}  # gang key -> UIDs of the kept pods naming it
        self._lock = threading.Lock()

    def get(self, *, uid: str = "", key: str = "") -> Mapping[str, Any] | None:
        if not uid:
            uid = self._uids.get(key, "")
        return self._pods.get(uid)

    def all(self) -> list[Mapping[str, Any]]:
        return list(self._pods.values())

    def gang_of(self, uid: str) -> str:
        """The gang key the kept object of ``uid`` names ("" for none, or not kept)."""
        return self._gang_of.get(uid, "")

    def of_gang(self, key: str) -> list[str]:
        """UIDs of the kept pods that name gang ``key``."""
        with self._lock:
            return list(self._by_gang.get(key, ()))

    def put(self, obj: Mapping[str, Any]) -> None:
        uid, key = pod_identity(obj)
        gang = gang_key(obj)
        with self._lock:
            self._unindex_gang(uid)
            self._pods[uid] = obj
            self._pods.move_to_end(uid)
            self._uids[key] = uid
            if gang:
                self._gang_of[uid] = gang
                self._by_gang.setdefault(gang, {})[uid] = None
            while len(self._pods) > self._limit:
                old_uid, old = self._pods.popitem(last=False)
                self._unindex_name(old_uid, old)
                self._unindex_gang(old_uid)

    def drop(self, uid: str) -> None:
        with self._lock:
            obj = self._pods.pop(uid, None)
            if obj is not None:
                self._unindex_name(uid, obj)
            self._unindex_gang(uid)

    def _unindex_name(self, uid: str, obj: Mapping[str, Any]) -> None:
        """Forget the name of ``uid``'s object, unless a pod re-created under it holds it now."""
        key = pod_identity(obj)[1]
        if self._uids.get(key) == uid:
            del self._uids[key]

    def _unindex_gang(self, uid: str) -> None:
        gang = self._gang_of.pop(uid, "")
        members = self._by_gang.get(gang)
        if members is not None:
            members.pop(uid, None)
            if not members:
                del self._by_gang[gang]
