"""The lifecycle controllers' loop: one round every ``interval_s`` while this replica leads.

Every controller is a ``Controller`` (one ``round``); the loop asks the Lease first, and a
replica that does not lead (or lost the Lease) runs nothing. A round that fails is logged and
the next one starts from the cluster as it then is: every act is idempotent and every decision is
taken again from what the API server says. What a controller keeps between rounds is only timing
and bookkeeping (the capacity controller's timers, which pods a buffer was for), which a restart or
a change of leader starts afresh without harm.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gpuweave.lifecycle.kube_replace import KubeReplacement
from gpuweave.lifecycle.replace import ReplacementPolicy, decide
from kubeio.lease import LeaseElector

log = logging.getLogger(__name__)


class Controller(Protocol):
    name: str

    def round(self) -> None: ...


@dataclass
class ReplacementController:
    """Hands nodes whose agent asks for a reboot or a replacement to their engine."""

    kube: KubeReplacement
    policy: ReplacementPolicy = field(default_factory=ReplacementPolicy)
    name: str = "replacement"

    def round(self) -> None:
        facts, total, nodes = self.kube.facts()
        for decision in decide(facts, nodes_total=total, policy=self.policy):
            log.info("node %s: %s (%s)", decision.node, decision.act, decision.reason)
            self.kube.carry_out(decision, nodes[decision.node])
        self.kube.forget(nodes)


@dataclass
class LifecycleService:
    controllers: Sequence[Controller]
    elector: LeaseElector | None = None  # None: this is the only replica (tests, a single pod)
    interval_s: float = 2.0
    rounds: int = 0

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            started = time.monotonic()
            self.round_once()
            stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))
        if self.elector is not None:
            self.elector.release()

    def round_once(self) -> bool:
        """One round of every controller if this replica leads; True when it ran."""
        if self.elector is not None and not self.elector.try_once():
            return False
        for controller in self.controllers:
            try:
                controller.round()
            except Exception as exc:
                log.warning(
                    "%s round failed: %s; next round in %.1f s", controller.name, exc, self.interval_s
                )
        self.rounds += 1
        return True
