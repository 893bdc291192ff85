"""One active replica for the extender's controllers: leader election through a Lease.

The extender's controllers (the Kueue admission check controller, and the sweep of stale
``GpuPreflight`` objects) write to the API server on their own, not in answer to a request, so
two replicas running them would write everything twice. Each runs only while this replica holds
the Lease ``--leader-elect-namespace``/``--leader-elect-name`` (``kubeio.lease``, client-go's
rules); the other replica keeps its watches and cache warm and takes over when the Lease expires.

Serving filter, prioritize, bind and preempt is *not* gated: kube-scheduler elects its own
leader, and only the leader's extender sidecar is called; a standby extender stays Ready.

``lease_settings`` checks the flags (pure); ``LeaderLoop`` runs the elector on its own thread
and reports each change of leadership (``Transition``) to its listeners: the metrics, a log line
and an Event on the Lease.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Protocol

from devicemodel.errors import InvalidInputError

LOG = logging.getLogger(__name__)
DEFAULT_LEASE_NAME = "gpuweave-extender"
DEFAULT_DURATION_S = 15
DEFAULT_RETRY_S = 5.0
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
MAX_IDENTITY = 128  # holderIdentity is free text; bound what a log line and an Event carry


class Leadership(Protocol):
    """Whether this replica may act now; asked before each write a controller makes."""

    def leading(self) -> bool: ...


class AlwaysLeading:
    """Leader election off (``--no-leader-elect``, a snapshot): this replica always acts."""

    def leading(self) -> bool:
        return True


@dataclass(frozen=True)
class LeaseSettings:
    """``gpuweave extender --leader-elect ...``: the Lease and its timing."""

    enabled: bool = True
    namespace: str = "default"
    name: str = DEFAULT_LEASE_NAME
    identity: str = ""
    duration_s: int = DEFAULT_DURATION_S
    retry_s: float = DEFAULT_RETRY_S


def default_identity(env: Mapping[str, str], hostname: str) -> str:
    """The pod's name (``POD_NAME`` from the downward API), else the host name, which in a pod is
    the pod's name too: a container restarted in the same pod renews its own Lease at once."""
    return (env.get("POD_NAME") or hostname).strip()[:MAX_IDENTITY]


def default_namespace(env: Mapping[str, str], service_account_namespace: str | None) -> str:
    """``POD_NAMESPACE``, else the namespace of the pod's service account, else ``default``."""
    return (env.get("POD_NAMESPACE") or service_account_namespace or "default").strip()


def lease_settings(
    *,
    enabled: bool,
    namespace: str | None,
    name: str,
    identity: str | None,
    duration_s: float,
    retry_s: float,
) -> LeaseSettings:
    """The flags checked: a holder must be able to miss one renewal before it stops acting
    (``duration_s - retry_s`` without a renewal), so ``retry_s`` is at most a third of the lease."""
    if not enabled:
        return LeaseSettings(enabled=False)
    if not (math.isfinite(duration_s) and duration_s == int(duration_s) and 2 <= duration_s <= 3600):
        raise InvalidInputError(f"--leader-elect-lease-duration {duration_s} is not a whole 2..3600 seconds")
    if not (math.isfinite(retry_s) and 0 < retry_s <= duration_s / 3):
        raise InvalidInputError(
            f"--leader-elect-retry-period {retry_s} is outside (0, {duration_s / 3:g}] seconds "
            "(at most a third of --leader-elect-lease-duration, so a holder can miss a renewal)"
        )
    ns = (
        namespace
        if namespace is not None
        else default_namespace(os.environ, _read(SERVICE_ACCOUNT_NAMESPACE))
    )
    who = identity if identity is not None else default_identity(os.environ, socket.gethostname())
    for flag, value in (("--leader-elect-namespace", ns), ("--leader-elect-name", name)):
        if not _dns_label(value, limit=253 if flag.endswith("name") else 63):
            raise InvalidInputError(
                f"{flag} {value!r} is not a Kubernetes name (lower case, digits, '-', '.')"
            )
    if not who or len(who) > MAX_IDENTITY or not who.isprintable():
        raise InvalidInputError(
            f"--leader-elect-identity {who[:MAX_IDENTITY]!r} is empty, too long or not printable"
        )
    return LeaseSettings(
        enabled=True, namespace=ns, name=name, identity=who, duration_s=int(duration_s), retry_s=retry_s
    )


def _dns_label(text: str, *, limit: int) -> bool:
    allowed = set("abcdefghijklmnopqrstuvwxyz0123456789-.")
    return 0 < len(text) <= limit and set(text) <= allowed and text[0].isalnum() and text[-1].isalnum()


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


class Transition(StrEnum):
    ACQUIRED = "leader"  # this replica took (or created) the Lease: its controllers run
    LOST = "standby"  # it could not renew in time, or another holds the Lease: they stop


def transition(*, was: bool, now: bool) -> Transition | None:
    """What changed between two looks at ``leading()``; None when nothing did."""
    if was == now:
        return None
    return Transition.ACQUIRED if now else Transition.LOST


class Elector(Protocol):
    """``kubeio.lease.LeaseElector``'s surface the loop uses."""

    def try_once(self) -> bool: ...

    def leading(self) -> bool: ...

    def release(self) -> None: ...


class LeaderLoop:
    """Runs ``elector.try_once`` every ``retry_s`` until ``stop``, which gives the Lease up so the
    standby takes over at once; ``listeners`` hear each ``Transition`` (on the loop's thread)."""

    def __init__(
        self,
        elector: Elector,
        *,
        retry_s: float,
        listeners: tuple[Callable[[Transition], None], ...] = (),
    ) -> None:
        self._elector = elector
        self._retry_s = retry_s
        self.listeners = listeners
        self._was = False
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpuweave-leader-election", daemon=True)

    def leading(self) -> bool:
        return self._elector.leading()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._halt.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self._retry_s + 5)
        self._elector.release()
        self._tell(leading=False)

    def _run(self) -> None:
        while not self._halt.is_set():
            self._tell(leading=self._elector.try_once())
            self._halt.wait(timeout=self._retry_s)

    def _tell(self, *, leading: bool) -> None:
        change = transition(was=self._was, now=leading)
        self._was = leading
        if change is None:
            return
        for listener in self.listeners:
            try:
                listener(change)
            except Exception:  # a listener's bug must not end the election
                LOG.exception("leader election listener failed on %s", change)
