"""The one list of resource kinds gpuweave serves, asked by the extender, the device plugin and the
DRA driver alike.

``KINDS`` holds the built-in kinds in the order the node's catalogue lists them. A kind added later
is one module implementing ``kind.ResourceKind`` and one ``KINDS.register(...)`` line; nothing else
branches on it: the extender parses, counts, plans, binds and describes it, and the node agent
lists, prefers and allocates it, through the calls below.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from devicekinds.device import PluginDevice
from devicekinds.efa import EfaAdapter
from devicekinds.gpu import WholeGpu
from devicekinds.imex import ImexChannel
from devicekinds.kind import ResourceKind
from devicekinds.mig import MigDevice
from devicekinds.shares import FractionalShare, TimeSlicedReplica
from devicemodel.errors import InvalidInputError


class KindRegistry:
    """Resource kinds in registration order; lookups by resource name and by device word."""

    def __init__(self, kinds: tuple[ResourceKind, ...] = ()) -> None:
        self._kinds: tuple[ResourceKind, ...] = ()
        self._lock = threading.Lock()
        for kind in kinds:
            self.register(kind)

    def register(self, kind: ResourceKind) -> ResourceKind:
        """Add ``kind``; an ``InvalidInputError`` when it claims a name or word another kind has."""
        with self._lock:
            for other in self._kinds:
                clash = set(kind.resources) & set(other.resources) or set(kind.words) & set(other.words)
                if clash or any(other.owns(r) for r in kind.resources):
                    claimed = sorted(clash) or list(kind.resources)
                    raise InvalidInputError(
                        f"resource kind {type(kind).__name__} claims {claimed}, "
                        f"already served by {type(other).__name__}"
                    )
            self._kinds = (*self._kinds, kind)
        return kind

    def unregister(self, kind: ResourceKind) -> None:
        with self._lock:
            self._kinds = tuple(k for k in self._kinds if k is not kind)

    def __iter__(self) -> Iterator[ResourceKind]:
        return iter(self._kinds)

    def kind_for(self, resource: str) -> ResourceKind | None:
        """The kind serving ``resource``, None for a name no kind owns."""
        return next((k for k in self._kinds if k.owns(resource)), None)

    def kind_of(self, device: PluginDevice) -> ResourceKind | None:
        """The kind that made ``device`` (by its word)."""
        return next((k for k in self._kinds if device.kind in k.words), None)

    def names_under(self, prefix: str) -> frozenset[str]:
        """Every fixed resource name beginning with ``prefix`` (for a message listing them)."""
        return frozenset(r for k in self._kinds for r in k.resources if r.startswith(prefix))

    def sibling_of(self, resource: str) -> str | None:
        """The resource whose last grant ``resource`` should sit beside, if any."""
        kind = self.kind_for(resource)
        return kind.siblings.get(resource) if kind is not None else None

    def is_sibling_target(self, resource: str) -> bool:
        return any(resource in k.siblings.values() for k in self._kinds)

    def planned_generically(self) -> tuple[ResourceKind, ...]:
        """The scheduled kinds the extender's core has no planner of its own for."""
        return tuple(k for k in self._kinds if k.scheduled and not k.core_planned)


KINDS = KindRegistry(
    (WholeGpu(), MigDevice(), FractionalShare(), TimeSlicedReplica(), EfaAdapter(), ImexChannel())
)
