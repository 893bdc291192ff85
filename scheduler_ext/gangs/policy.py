"""The gang policy: every hook the extender's verbs and its cache call on gangs, by name.

``ExtenderService`` always holds one: the gang service (``gangs.service.GangCoordinator``) while
gang placement is on, ``NoGangs`` when ``--gang-ttl 0`` turned it off. The verbs call the hooks
without asking which one they hold, so turning gangs off changes no path through a verb, and a
new thing a verb needs of gangs is a new hook here, with its no-op in ``NoGangs`` and its work in
the gang service. The hooks in order: filter (``gang_of``, ``sweep``, ``filter``,
``unplaced_alone``, ``keep_places``), bind (``take_slot``, ``give_back``, ``bound``,
``bound_alone``), preempt (``preemption_room``), the cache's events (``pod_gone``) and the
wiring (``rebuild``, ``tell_refused_holds``).

The no-op policy sees no gang in any pod (``gang_of`` is None, even for a pod whose gang
annotations are nonsense: they mean nothing with gangs off), so the hooks that take a gang are
never reached through it; they answer "the ordinary path applies" all the same.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from devicemodel.gangs import Gang
from scheduler_ext.cluster.cache import PodGone
from scheduler_ext.gangs.book import Reservation, Slot
from scheduler_ext.gangs.plan import GangAnswer
from scheduler_ext.pods.host import HostRequest
from scheduler_ext.pods.requests import PodRequest

Taken = tuple[Reservation, Slot]  # a member's slot, taken over by its bind
HoldRefused = Callable[[PodRequest, str], None]  # (the member filtered, the reason): a pod Event


class GangPolicy(Protocol):
    """What the extender asks of gangs. ``GangCoordinator`` and ``NoGangs`` are the two."""

    # ---- filter (``gang_of`` for prioritize and preempt too) ------------------------------------
    def gang_of(self, pod: Mapping[str, Any]) -> Gang | None:
        """The pod's gang, None for none; raises ``gangs.BadGangError`` for one it cannot act on."""

    def sweep(self) -> None:
        """Release what expired, so the decision that follows sees those devices free."""

    def filter(
        self, gang: Gang, request: PodRequest, names: list[str], host: HostRequest
    ) -> GangAnswer | None:
        """The member's nodes; None when the ordinary path applies."""

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
        """Filter's answer for a gang of one that fits none of ``names``; None: the ordinary one."""

    def keep_places(self, names: list[str], fits: list[bool]) -> list[bool] | None:
        """``fits`` without the nodes kept for waiting gangs; None when nothing changes."""

    # ---- bind ------------------------------------------------------------------------------------
    def take_slot(self, uid: str, node: str) -> Taken | None:
        """The member's planned slot on ``node``, released for its bind (node lock held)."""

    def give_back(self, taken: Taken, request: PodRequest) -> None:
        """Hold a taken slot again: its member's bind failed."""

    def bound(self, taken: Taken) -> None:
        """The member of a taken slot is bound."""

    def bound_alone(self, pod: Mapping[str, Any], node: str) -> None:
        """A pod naming a gang was bound without a slot (a gang of one remembers its run)."""

    # ---- preempt ---------------------------------------------------------------------------------
    def preemption_room(
        self, gang: Gang, request: PodRequest, proposed: Sequence[str], host: HostRequest
    ) -> frozenset[str]:
        """Of ``proposed``, the nodes where a member of ``gang`` may evict."""

    # ---- the cache's events and the wiring -------------------------------------------------------
    def pod_gone(self, gone: PodGone) -> None:
        """The cache's ``on_pod_gone``: a pod that named a gang left the cache."""

    def rebuild(self) -> int:
        """Once the cache holds the cluster after a start: hold the gangs' places again; how many."""

    def tell_refused_holds(self, tell: HoldRefused) -> None:
        """Where a hold refused for a namespace's limit is told (an Event on the member)."""


class NoGangs:
    """Gangs off: no pod is a gang's, nothing is held, swept, kept or remembered."""

    def gang_of(self, pod: Mapping[str, Any]) -> Gang | None:
        return None

    def sweep(self) -> None:
        return None

    def filter(
        self, gang: Gang, request: PodRequest, names: list[str], host: HostRequest
    ) -> GangAnswer | None:
        return None

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
        return None

    def keep_places(self, names: list[str], fits: list[bool]) -> list[bool] | None:
        return None

    def take_slot(self, uid: str, node: str) -> Taken | None:
        return None

    def give_back(self, taken: Taken, request: PodRequest) -> None:
        return None

    def bound(self, taken: Taken) -> None:
        return None

    def bound_alone(self, pod: Mapping[str, Any], node: str) -> None:
        return None

    def preemption_room(
        self, gang: Gang, request: PodRequest, proposed: Sequence[str], host: HostRequest
    ) -> frozenset[str]:
        return frozenset(proposed)  # no gang rules: every proposed node stays a candidate

    def pod_gone(self, gone: PodGone) -> None:
        return None

    def rebuild(self) -> int:
        return 0

    def tell_refused_holds(self, tell: HoldRefused) -> None:
        return None


NO_GANGS: GangPolicy = NoGangs()  # stateless: one serves every extender, and every plain pod's bind


def gang_policy(policy: GangPolicy | None) -> GangPolicy:
    """``policy``, or the no-op one for None (how a caller that predates the policy says "off")."""
    return NO_GANGS if policy is None else policy
