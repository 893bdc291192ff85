"""One active controller: leader election through a ``coordination.k8s.io`` Lease (the lifecycle
controller and the extender's controllers run under it).

The rules are client-go's: a holder renews the Lease every ``renew_s``; a candidate takes it only
once ``leaseDurationSeconds`` passed since the last renewal it observed *on its own clock* (so
clock skew between replicas does not matter: it times from when it saw the record change), and
every write carries the resourceVersion it read, so two candidates never both win. A holder that
could not renew for ``duration_s - renew_s`` stops acting before anyone else may start.
``step`` is the pure rule; ``LeaseElector`` runs it against the API server.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson
from kubernetes.client.exceptions import ApiException

from kubeio.client import finish
from kubeio.errors import CONFLICT, NOT_FOUND, status_of

log = logging.getLogger(__name__)


class LeaseStep(StrEnum):
    CREATE = "create"  # no Lease yet
    RENEW = "renew"  # ours
    TAKE = "take"  # another's, expired by our clock
    FOLLOW = "follow"  # another's, still valid


@dataclass(frozen=True)
class LeaseRecord:
    holder: str
    renew_time: str  # as written; compared for change, never parsed against our clock
    duration_s: int
    transitions: int
    resource_version: str


def step(record: LeaseRecord | None, *, me: str, unchanged_for_s: float) -> LeaseStep:
    """What to do with the Lease as read; ``unchanged_for_s`` is how long (our monotonic clock)
    the holder and renew time have looked as they do now."""
    if record is None:
        return LeaseStep.CREATE
    if record.holder == me:
        return LeaseStep.RENEW
    if not record.holder or unchanged_for_s >= record.duration_s:
        return LeaseStep.TAKE
    return LeaseStep.FOLLOW


def micro_time(now: datetime.datetime) -> str:
    """A MicroTime as the API server parses it (RFC 3339, six fraction digits)."""
    return now.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseElector:
    """Leader election for ``identity`` on Lease ``namespace/name`` (``CoordinationV1Api``)."""

    def __init__(
        self,
        coordination: Any,
        *,
        namespace: str,
        name: str,
        identity: str,
        duration_s: int = 15,
        renew_s: float = 5.0,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
    ) -> None:
        self._api = coordination
        self.namespace, self.name, self.identity = namespace, name, identity
        self.duration_s, self.renew_s = duration_s, renew_s
        self._monotonic, self._wall = monotonic, wall
        self._seen: tuple[str, str] | None = None  # (holder, renewTime) last observed
        self._seen_at = 0.0
        self._renewed_at: float | None = None  # monotonic time of our last successful write

    def leading(self) -> bool:
        """True while our last renewal is recent enough that no other candidate can have taken
        over (it waits ``duration_s`` from its own observation; we stop ``renew_s`` earlier)."""
        if self._renewed_at is None:
            return False
        return self._monotonic() - self._renewed_at < self.duration_s - self.renew_s

    def try_once(self) -> bool:
        """Read the Lease and create, renew or take it when the rules allow; returns ``leading()``."""
        try:
            record, raw = self._read()
            action = step(record, me=self.identity, unchanged_for_s=self._unchanged_for(record))
            if action is LeaseStep.FOLLOW:
                self._renewed_at = None
            elif action is LeaseStep.CREATE:
                self._api.create_namespaced_lease(self.namespace, self._body(None, taking=True))
                self._won(action)
            else:
                self._api.replace_namespaced_lease(
                    self.name, self.namespace, self._body(raw, taking=action is LeaseStep.TAKE)
                )
                self._won(action)
        except ApiException as exc:
            if status_of(exc) not in (CONFLICT, NOT_FOUND):
                log.warning("lease %s/%s: %s", self.namespace, self.name, exc.reason)
            # lost a race: another candidate wrote first; try again next time
        except Exception as exc:  # transport failures: keep what we had until it expires
            log.warning("lease %s/%s unreachable: %s", self.namespace, self.name, exc)
        return self.leading()

    def release(self) -> None:
        """Give the Lease up on a clean stop, so a standby takes over at once."""
        if not self.leading():
            return
        try:
            record, raw = self._read()
            if record is not None and record.holder == self.identity and raw is not None:
                raw["spec"]["holderIdentity"] = ""
                self._api.replace_namespaced_lease(self.name, self.namespace, raw)
        except Exception as exc:
            log.info("lease %s/%s not released: %s", self.namespace, self.name, exc)
        self._renewed_at = None

    def _won(self, action: LeaseStep) -> None:
        if not self.leading():
            log.info("lease %s/%s: %s by %s; now leading", self.namespace, self.name, action, self.identity)
        self._renewed_at = self._monotonic()

    def _read(self) -> tuple[LeaseRecord | None, dict[str, Any] | None]:
        try:
            answer = self._api.read_namespaced_lease(self.name, self.namespace, _preload_content=False)
        except ApiException as exc:
            if status_of(exc) == NOT_FOUND:
                return None, None
            raise
        raw: dict[str, Any] = orjson.loads(finish(answer))
        spec = raw.get("spec") or {}
        record = LeaseRecord(
            holder=str(spec.get("holderIdentity") or ""),
            renew_time=str(spec.get("renewTime") or ""),
            duration_s=int(spec.get("leaseDurationSeconds") or self.duration_s),
            transitions=int(spec.get("leaseTransitions") or 0),
            resource_version=str((raw.get("metadata") or {}).get("resourceVersion") or ""),
        )
        return record, raw

    def _unchanged_for(self, record: LeaseRecord | None) -> float:
        now = self._monotonic()
        seen = (record.holder, record.renew_time) if record is not None else None
        if seen != self._seen:
            self._seen, self._seen_at = seen, now
        return now - self._seen_at

    def _body(self, raw: dict[str, Any] | None, *, taking: bool) -> dict[str, Any]:
        now = micro_time(self._wall())
        body = raw or {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name},
        }
        spec = dict(body.get("spec") or {})
        spec.update(holderIdentity=self.identity, leaseDurationSeconds=self.duration_s, renewTime=now)
        if taking:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (1 if raw else 0)
        body["spec"] = spec
        return body
