"""The node's IMEX domain in DRA mode: the GpuImexDomain its channel's claim joined, and its status.

``NodeImexDomains`` sits between the claim preparer and the node agent's IMEX reconciler
(``gpuweave.node.imex``):

- at prepare of a claim that holds the node's IMEX channel and names a domain
  (``dradriver.imex_domain.channel_domain``), ``join`` adds this node's entry (its name, its Node's
  InternalIP, its clique) to the domain's ``status.nodes`` through ``DomainApi`` and follows the
  object (a watch of that one name); at unprepare ``leave`` removes the entry and stops following;
- the reconciler asks ``decide`` which domain the node's IMEX daemon serves (the status entries of
  this node's clique) and waits on ``wait_for_change``, as it does on the pod view in device-plugin
  mode, so one reconciler and one writer serve the node in both modes.

The node has one IMEX channel, so it joins one domain at a time: a second claim naming a domain
while another holds the channel is refused at prepare (the allocator gives the one channel device
to one claim, so only a hand-made allocation gets there). After a restart the preparer's
checkpoint says which claim joined which domain (``hold``, no API write).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

from dradriver.imex_domain import DomainNode, DomainRef, ImexDomainError, domain_decision
from nodeagent.imex import ImexDecision
from nodeagent.versioned import VersionedState

log = logging.getLogger(__name__)

StopWatch = Callable[[], None]


class DomainApi(Protocol):
    """The API server's side (``dradriver.kube.KubeImexDomains``); failures raise ``GpuweaveError``."""

    def address(self, node: str) -> str:
        """The Node's InternalIP, "" when it has none."""
        ...

    def join(self, ref: DomainRef, entry: DomainNode) -> None: ...

    def leave(self, ref: DomainRef, node: str) -> None: ...

    def watch(self, ref: DomainRef, on_object: Callable[[Mapping[str, Any] | None], None]) -> StopWatch:
        """Follow the object: ``on_object`` with it on every change, None when it is gone."""
        ...


@dataclass(frozen=True)
class Holding:
    """The claim that holds the node's channel and the domain it joined."""

    uid: str
    holder: str  # namespace/name of the claim
    ref: DomainRef


class NodeImexDomains(VersionedState):
    """The one domain this node joined (see the module docstring)."""

    def __init__(self, *, node: str, api: DomainApi, clique: Callable[[], str | None]) -> None:
        super().__init__()
        self._node = node
        self._api = api
        self._clique = clique
        self._held: Holding | None = None
        self._object: Mapping[str, Any] | None = None
        self._seen = False  # the watch delivered the object (or said it is gone) since the hold
        self._stop_watch: StopWatch | None = None

    @property
    def held(self) -> Holding | None:
        with self._lock:
            return self._held

    def join(self, *, uid: str, holder: str, ref: DomainRef) -> None:
        """Add this node's entry to ``ref``'s status and follow it; ``ImexDomainError`` (or the
        API's error) when the node cannot."""
        held = self.held
        if held is not None and held.uid != uid:
            raise ImexDomainError(
                f"the node's IMEX channel is held by claim {held.holder} in {held.ref.describe()}; "
                "the node's IMEX daemon serves one domain at a time"
            )
        clique = self._clique()
        if clique is None:
            raise ImexDomainError(f"node {self._node} is in no multi-node NVLink domain (no clique)")
        address = self._api.address(self._node)
        if not address:
            raise ImexDomainError(f"node {self._node} has no InternalIP: its IMEX peers could not reach it")
        self._api.join(ref, DomainNode(name=self._node, address=address, clique=clique))
        log.info("node %s joined %s for claim %s", self._node, ref.describe(), holder)
        self.hold(uid=uid, holder=holder, ref=ref)

    def hold(self, *, uid: str, holder: str, ref: DomainRef) -> None:
        """Follow ``ref`` for claim ``uid`` without writing (joined already: a restart)."""
        holding = Holding(uid, holder, ref)
        with self._changed:
            if self._held == holding:
                return
            previous, self._stop_watch = self._stop_watch, None
            self._held, self._object, self._seen = holding, None, False
            self._touch()
        if previous is not None:
            previous()
        stop: StopWatch | None = self._api.watch(ref, partial(self._observed, holding))
        with self._changed:
            if self._held == holding:
                self._stop_watch, stop = stop, None
        if stop is not None:  # released while the watch started
            stop()

    def leave(self, *, uid: str, ref: DomainRef) -> None:
        """Remove this node's entry from ``ref``'s status (gone already: nothing to do) and stop
        following it; the API's error when the write fails (the kubelet retries the unprepare)."""
        self._api.leave(ref, self._node)
        log.info("node %s left %s", self._node, ref.describe())
        self.release(uid)

    def release(self, uid: str) -> None:
        """Stop following the domain of claim ``uid`` (no API write)."""
        with self._changed:
            if self._held is None or self._held.uid != uid:
                return
            stop, self._stop_watch = self._stop_watch, None
            self._held, self._object, self._seen = None, None, False
            self._touch()
        if stop is not None:
            stop()

    def stop(self) -> None:
        with self._changed:
            stop, self._stop_watch = self._stop_watch, None
        if stop is not None:
            stop()

    def _observed(self, holding: Holding, obj: Mapping[str, Any] | None) -> None:
        with self._changed:
            if self._held != holding:
                return
            self._object, self._seen = obj, True
            self._touch()

    # the IMEX reconciler's source (gpuweave.node.imex.ImexSource): version and wait_for_change
    # (VersionedState), and

    def decide(self, *, node: str, clique: str | None) -> ImexDecision:
        with self._lock:
            held, obj, seen = self._held, self._object, self._seen
        if held is None:
            return ImexDecision(None)
        if not seen:
            return ImexDecision(None, held.holder)  # until the watch delivers the object
        return domain_decision(obj, ref=held.ref, holder=held.holder, node=node, clique=clique)
