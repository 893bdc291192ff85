"""Recovery: where a recovering gang may preempt, and the gang rules for a gang of one.

A gang whose family ran and lost a member to a fault or a preemption since
(``GangBook.recovering_nodes``) and does not fit now is planned again as if every pod of lower
priority than its members were gone (within its required tier, ``gpuweave.io/gang-tier``, as
every plan of it is); where that plan holds it, the nodes of the plan's domain that such an
eviction would open for a member are the gang's room (``room``). Filter answers the offered nodes
in the room as resolvable; the preempt verb (``preemption_room``) plans over the nodes last
offered plus kube-scheduler's candidates (nodes its own filters rejected, e.g. for too few free
GPUs, reach only the preempt call) and narrows the candidates to the room. Every other gang that
does not fit is answered unresolvable, and its members' preemption is refused; so is a recovering
gang whose members are not all created yet.

A gang of one (``Gang.alone``) has no plan: only when it fits no offered node do the gang rules
apply (``unplaced_alone``): re-created after an attempt that ran and was evicted or preempted, its
room is found as a recovering gang's is, and the preempt verb narrows to it; otherwise every node
is unresolvable and its preemption is refused.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from devicemodel.gangs import BadGangError, Gang
from scheduler_ext.cluster.cache import ClusterCache
from scheduler_ext.cluster.objects import PodRecord
from scheduler_ext.cluster.preempt import evictable
from scheduler_ext.decide.core import DecisionCore
from scheduler_ext.decide.state import NodeState
from scheduler_ext.gangs.book import GangBook
from scheduler_ext.gangs.plan import GangAnswer, GangMiss, plan_gang
from scheduler_ext.pods.host import HostRequest
from scheduler_ext.pods.requests import PodRequest
from topology.network import tier_domain

GangOf = Callable[[Mapping[str, Any]], Gang | None]


@dataclass
class Recovery:
    """The recovery rules over the cache, the decision core and the gang book."""

    cache: ClusterCache
    core: DecisionCore
    book: GangBook
    tier_labels: Sequence[str]
    gang_of: GangOf  # the coordinator's (PodGroup sizes and tier labels applied)
    wall_clock: Callable[[], float] = time.time  # pods' start times are Unix seconds

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
        """Filter's answer for a gang of one that fits none of ``names`` (the ordinary path found
        ``failed`` resolvable, ``hopeless`` not), under the gang rules for preemption: recovering
        (re-created after an attempt that ran and was evicted or preempted), the nodes of its room
        are resolvable and every other node is not; any other gang of one gets every node
        unresolvable, as a gang that never ran. None:
        the ordinary answer stands (not a gang of one, or every node is unresolvable anyway)."""
        if not gang.alone:
            return None
        room: frozenset[str] = frozenset()
        preferred = self.book.recovering_nodes(gang.family)
        if preferred:
            needed, placed_nodes = placed_members(self.cache, gang)
            self.book.remember_offered(gang.key, names)
            if needed > 0:
                room = self.room(
                    gang, request, names, host, needed=needed, placed_nodes=placed_nodes, preferred=preferred
                )
        if not failed and not room:
            return None
        return room_answer(gang, names, room, {**hopeless, **failed})

    def room(
        self,
        gang: Gang,
        request: PodRequest,
        names: list[str],
        host: HostRequest,
        *,
        needed: int,
        placed_nodes: Sequence[str],
        preferred: frozenset[str],
    ) -> frozenset[str]:
        """For a recovering gang (``preferred``: where its last attempt ran) that does not fit:
        the nodes of the domain where it fits once lower-priority pods are gone, each of which
        such an eviction opens for a member. Empty when the gang is not recovering or no
        eviction of lower-priority pods makes it fit."""
        if not preferred:
            return frozenset()
        states = self.cache.states()
        freed: dict[str, NodeState] = {}
        for name in dict.fromkeys(names):
            state = states.get(name)
            if state is None or state.layout is None:
                continue
            victims = [
                r for r in self.cache.holdings_on(name) if evictable(r, request, set(), cache=self.cache)
            ]
            if victims:
                freed[name] = self.core.registry.tokenized(without_pods(state, victims))
        if not freed:
            return frozenset()
        labels = self.cache.node_labels()
        outcome = plan_gang(
            key=gang.key,
            needed=needed,
            candidates=names,
            states={**states, **freed},
            labels=labels,
            decide=lambda state: self.core.decide(request, state, host=host),
            tier_labels=self.tier_labels,
            placed_nodes=placed_nodes,
            preferred=preferred,
            required_tier=gang.tier,
        )
        if isinstance(outcome, GangMiss):
            return frozenset()
        if outcome.tier >= len(self.tier_labels):  # no labelled domain: only the plan's own nodes
            domain = [s.node for s in outcome.slots if s.node in freed]
        else:
            domain = [
                n
                for n in freed
                if tier_domain(labels.get(n, {}), outcome.tier, tier_labels=self.tier_labels)
                == outcome.domain
            ]
        return frozenset(n for n in domain if self.core.decide(request, freed[n], host=host).fits)

    def preemption_room(
        self, gang: Gang, request: PodRequest, proposed: Sequence[str], host: HostRequest
    ) -> frozenset[str]:
        """The preempt verb's candidates (``proposed``) where evicting lower-priority pods opens a
        place of this recovering gang's plan; empty for a gang that is not recovering, is planned
        already, or fits nowhere even so. Planned over the nodes last offered for it, the nodes
        kube-scheduler nominated for its members (it counts a nominated member there, so it
        neither offers nor proposes that node for the next one) and ``proposed``: kube-scheduler
        offers the extender only nodes its own filters passed, and no node it rejected for
        another reason (a selector, a taint, an unusable network adapter) is planned on. The
        nodes answered here are remembered for the gang's later members (``remember_preempting``):
        the nomination that makes kube-scheduler skip such a node reaches the extender's watch
        after the next member's call may have come."""
        preferred = self.book.recovering_nodes(gang.family)
        if not preferred or self.book.get(gang.key) is not None:
            return frozenset()
        needed, placed_nodes = placed_members(self.cache, gang)
        # the asking pod counts as created even before the extender's watch brings it
        members = {*self.cache.gang_member_uids(gang.key), request.uid}
        if needed <= 0 or len(members) < gang.size:
            return frozenset()
        candidates = list(
            dict.fromkeys(
                [
                    *self.book.offered(gang.key),
                    *self.book.preempting(gang.key),
                    *self._nominated(gang),
                    *proposed,
                ]
            )
        )
        room = self.room(
            gang,
            request,
            candidates,
            host,
            needed=needed,
            placed_nodes=placed_nodes,
            preferred=preferred,
        )
        states = self.cache.states()
        free_now = sum(
            1
            for n in candidates
            if (state := states.get(n)) is not None and self.core.decide(request, state, host=host).fits
        )
        allowed = self._cheapest(room & frozenset(proposed), request, needed=max(1, needed - free_now))
        if allowed:
            self.book.remember_preempting(gang.key, sorted(allowed))
        return allowed

    def _cheapest(self, nodes: frozenset[str], request: PodRequest, *, needed: int) -> frozenset[str]:
        """Of ``nodes``, the ``needed`` (members with no free place now) whose evictable pods have
        run the least device-time (ties kept): an evicted pod restarts from its beginning, so what
        it ran is lost. kube-scheduler picks among the candidates by priority and then the fewest
        victims, which would as soon evict one 8-GPU job minutes from its end as three single-GPU
        pods that just started. A node a member fits now needs no eviction (``needed`` counts
        only the members without one)."""
        if len(nodes) <= needed:
            return nodes
        now = self.wall_clock()
        lost = {
            node: sum(
                len(r.devices) * max(0.0, now - (r.started_s if r.started_s is not None else now))
                for r in self.cache.holdings_on(node)
                if evictable(r, request, set(), cache=self.cache)
            )
            for node in nodes
        }
        cutoff = sorted(lost.values())[needed - 1]
        return frozenset(n for n, cost in lost.items() if cost <= cutoff)

    def _nominated(self, gang: Gang) -> list[str]:
        """Nodes kube-scheduler nominated for the gang's pending members (as the cache last saw them)."""
        nodes = []
        for pod in self.cache.pod_objects():
            nominated = (pod.get("status") or {}).get("nominatedNodeName")
            if nominated and not (pod.get("spec") or {}).get("nodeName"):
                try:
                    if (found := self.gang_of(pod)) is not None and found.key == gang.key:
                        nodes.append(str(nominated))
                except BadGangError:
                    continue
        return nodes


def placed_members(cache: ClusterCache, gang: Gang) -> tuple[int, list[str]]:
    """(members still to place, nodes of the members placed): bound or mid-bind members."""
    placed = [r for r in cache.gang_members(gang.key) if r.node]
    return gang.size - len(placed), sorted({r.node for r in placed if r.node})


def without_pods(state: NodeState, pods: Sequence[PodRecord]) -> NodeState:
    """The node as it would be once ``pods`` are gone: their devices and host share free."""
    return without_holders(
        state,
        {p.uid for p in pods},
        cpu_milli=sum(p.cpu_milli for p in pods),
        memory_mib=sum(p.memory_mib for p in pods),
    )


def without_holders(state: NodeState, gone: set[str], *, cpu_milli: int, memory_mib: int) -> NodeState:
    """The node with the devices of the holders in ``gone`` free and their host share back."""
    freed = state.with_holders({d: u for d, u in state.holders.items() if u not in gone})
    if state.host_free is not None and (cpu_milli or memory_mib):
        cpu, memory = state.host_free
        freed = freed.with_host_free((cpu + cpu_milli, memory + memory_mib))
    return freed


def room_answer(gang: Gang, names: list[str], room: frozenset[str], others: Mapping[str, str]) -> GangAnswer:
    """Filter's answer for a recovering gang (a gang of one too) that fits once lower-priority pods
    are preempted: the nodes of ``room`` resolvable, every other offered node unresolvable with its
    reason in ``others``."""
    reason = (
        f"gang {gang.key} is recovering and fits once pods of lower priority than its "
        f"members on {len(room)} node(s) of its network domain are preempted"
    )
    return GangAnswer(
        [],
        failed={n: reason for n in names if n in room},
        hopeless={n: r for n in names if n not in room and (r := others.get(n)) is not None},
    )
