"""Interning of node layouts: one ``NodeLayout`` (and one topology search) per distinct layout.

Nodes of the same hardware and sharing configuration get the same small integer ``layout_id``;
the decision memo keys on it, so a 15,000-node cluster of six machine types decides each
(layout, free state, request) once.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import replace

from devicemodel.inventory import NodeInventory
from devicemodel.sharing import GpuSharing
from scheduler_ext.decide.layout import LayoutIndex, NodeLayout, build_layout
from scheduler_ext.decide.search import LayoutSearch
from scheduler_ext.decide.state import NodeState

MAX_TOKENS = 1_000_000


class LayoutRegistry:
    """Thread-safe map layout -> id -> search."""

    def __init__(self) -> None:
        self._ids: dict[NodeLayout, int] = {}
        self._searches: list[LayoutSearch] = []
        self._tokens: dict[tuple[object, ...], int] = {}
        self._next_token = 0
        self._lock = threading.Lock()

    def node_state(
        self,
        inventory: NodeInventory,
        *,
        name: str,
        sharing: Mapping[str, GpuSharing] | None = None,
        unhealthy: frozenset[str] = frozenset(),
        holders: Mapping[str, str] | None = None,
    ) -> NodeState:
        layout, index = build_layout(inventory, sharing=sharing)
        layout_id, layout = self._intern(layout, inventory)
        return self.tokenized(
            NodeState(
                name=name,
                layout=layout,
                layout_id=layout_id,
                index=index,
                unhealthy=unhealthy,
                holders=dict(holders or {}),
            )
        )

    def tokenized(self, state: NodeState) -> NodeState:
        """The state with its memo token set (states with equal layout and free state share one)."""
        if state.token >= 0:
            return state
        return replace(state, token=self.token(state.memo_key))

    def token(self, key: tuple[object, ...]) -> int:
        found = self._tokens.get(key)
        if found is None:
            with self._lock:
                found = self._tokens.get(key)
                if found is None:
                    if len(self._tokens) >= MAX_TOKENS:  # tokens are never reused, so old ones stay valid
                        self._tokens.clear()
                    found = self._next_token
                    self._next_token += 1
                    self._tokens[key] = found
        return found

    def _intern(self, layout: NodeLayout, inventory: NodeInventory) -> tuple[int, NodeLayout]:
        with self._lock:
            existing = self._ids.get(layout)
            if existing is not None:
                return existing, self._searches[existing].layout
            layout_id = len(self._searches)
            self._searches.append(LayoutSearch(layout, inventory))
            self._ids[layout] = layout_id
            return layout_id, layout

    def search(self, layout_id: int) -> LayoutSearch:
        return self._searches[layout_id]

    def __len__(self) -> int:
        return len(self._searches)


__all__ = ["LayoutIndex", "LayoutRegistry"]
