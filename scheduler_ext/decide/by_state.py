"""Filter's per-node work done once per node state: group the names by memo token, decide and
rank each distinct state once, spread the answers back to the names with numpy.

A token names a node's state (its layout, hence its kind, and its free devices), and equal tokens
decide alike, so 15,000 nodes come down to a few dozen states. What stays per name is what the
answer itself holds: the token lookup, the passing names and the rejected names with their
reasons, each one C-level or numpy pass. A name with no token (a node that came into the cache
while the call ran) is a state of its own.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import compress, pairwise, repeat
from operator import attrgetter, itemgetter

import numpy as np
import orjson

from devicemodel.errors import clip
from scheduler_ext.decide.verdict import Verdict

_FITS, _UNRESOLVABLE, _REASON, _HELD = (attrgetter(a) for a in ("fits", "unresolvable", "reason", "held"))


def _distinct(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``numpy.unique(keys, return_inverse=True)``. Tokens are small ints handed out in order, so
    the keys of one request usually span a range not much wider than their count: then a count
    per value and a lookup table replace the sort (15,000 keys: 0.04 ms against 0.6 ms)."""
    if keys.size:
        low, high = int(keys.min()), int(keys.max())
        span = high - low + 1
        if span <= 4 * keys.size + 1024:
            shifted = keys - low
            unique = np.flatnonzero(np.bincount(shifted, minlength=span))
            table = np.empty(span, dtype=np.int64)
            table[unique] = np.arange(len(unique))
            return unique + low, table[shifted]
    unique, inverse = np.unique(keys, return_inverse=True)  # return_index would take a stable sort
    return unique, inverse.reshape(-1)


@dataclass(frozen=True)
class StateGroups:
    """The names of one request grouped by state: ``first[i]`` is the position of the first name
    in state ``i``, ``inverse[j]`` the state of name ``j``, ``tokens[i]`` state ``i``'s token
    (None: a name the cache did not know when its tokens were looked up)."""

    first: list[int]
    inverse: np.ndarray
    tokens: list[int | None]

    @staticmethod
    def of(tokens: np.ndarray) -> StateGroups:
        """From the names' tokens (``TokenIndex.keys``: -1 where a name has none)."""
        missing = np.flatnonzero(tokens < 0)
        keys = tokens
        if missing.size:  # tokens are never negative: each missing one gets a key of its own below 0
            keys = tokens.copy()
            keys[missing] = -1 - missing
        unique, inverse = _distinct(keys)
        first = np.empty(len(unique), dtype=np.int64)
        first[inverse[::-1]] = np.arange(len(keys) - 1, -1, -1)  # the last write is the first name
        return StateGroups(
            first=first.tolist(),
            inverse=inverse,
            tokens=[None if k < 0 else k for k in unique.tolist()],
        )

    def present(self, mask: np.ndarray) -> tuple[list[int], np.ndarray]:
        """The states that some name in ``mask`` has, in state order, and each masked name's
        position among them (a count per state, no sort)."""
        states = self.inverse[mask]
        seen = np.bincount(states, minlength=len(self.first)) > 0
        position = np.cumsum(seen) - 1
        return np.flatnonzero(seen).tolist(), position[states]

    def representatives(self, names: Sequence[str]) -> list[str]:
        """One name per state, in state order (the name each state is decided on)."""
        return [names[i] for i in self.first]


class RejectedNames(Mapping[str, str]):
    """Rejected name -> reason for one filter call, kept as one reason per state and a mask over
    the request's names. The name -> reason dict is built only when something reads it by name
    (an Event for a pod that fits nowhere, a test); the answer's JSON is written per state
    (``json``), which at 15,000 names costs half of building the dict and encoding it."""

    def __init__(self, names: Sequence[str], mask: np.ndarray, states: np.ndarray, reasons: Sequence[str]):
        self._names = names  # every name of the request
        self._mask = mask  # bool per name: rejected here
        self._states = states  # state per name
        self._reasons = reasons  # reason per state
        self._dict: dict[str, str] | None = None

    def _built(self) -> dict[str, str]:
        if self._dict is None:
            reasons = np.array(self._reasons, dtype=object)[self._states[self._mask]].tolist()
            self._dict = dict(zip(compress(self._names, self._mask.tolist()), reasons, strict=True))
        return self._dict

    def __getitem__(self, name: str) -> str:
        return self._built()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._built())

    def __len__(self) -> int:
        return len(self._built())

    def __bool__(self) -> bool:
        return bool(self._mask.any())

    def __eq__(self, other: object) -> bool:
        return self._built() == other if isinstance(other, Mapping) else NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable-equal like the dict it stands for

    def __repr__(self) -> str:
        return f"RejectedNames({self._built()!r})"

    def json(self) -> bytes:
        """The JSON object, written per state: the state's names as one orjson-encoded list whose
        separators take the reason. When no name needs escaping (no backslash in the encoded
        names, so every quote in them is a string's edge) and no name holds a comma (the list's
        commas are exactly its separators: a name ``,`` encodes as ``","`` itself), the only
        ``","`` in the list are the separators; otherwise the dict is encoded. Node names are DNS
        subdomains, so the fallback is for hostile or odd input only."""
        positions = np.flatnonzero(self._mask)
        if not positions.size:
            return b"{}"
        states = self._states[positions]
        order = np.argsort(states, kind="stable")
        ordered = states[order]
        starts = [0, *(np.flatnonzero(ordered[1:] != ordered[:-1]) + 1).tolist(), len(ordered)]
        picked = positions[order].tolist()
        names = (
            [self._names[i] for i in picked] if len(picked) < 2 else list(itemgetter(*picked)(self._names))
        )
        parts: list[bytes] = []
        for begin, end in pairwise(starts):
            encoded = orjson.dumps(names[begin:end])
            if b"\\" in encoded or encoded.count(b",") != end - begin - 1:
                return orjson.dumps(self._built())
            reason = b":" + orjson.dumps(self._reasons[int(ordered[begin])])
            parts.append(encoded[1:-1].replace(b'","', b'"' + reason + b',"') + reason)
        return b"{" + b",".join(parts) + b"}"


@dataclass(frozen=True)
class Filtered:
    """Filter's per-name answer, spread from one verdict per state."""

    fits: np.ndarray  # bool per name
    failed: Mapping[str, str]  # rejected, preemption may help
    hopeless: Mapping[str, str]  # rejected, nothing on the node can help
    rejected: dict[str, int]  # names rejected per distinct reason (counted per state: no pass per name)

    @staticmethod
    def spread(names: Sequence[str], groups: StateGroups, verdicts: Sequence[Verdict]) -> Filtered:
        fits = np.fromiter(map(_FITS, verdicts), dtype=bool, count=len(verdicts))[groups.inverse]
        if fits.all():
            return Filtered(fits, {}, {}, {})
        unresolvable = np.fromiter(map(_UNRESOLVABLE, verdicts), dtype=bool, count=len(verdicts))
        reasons = [clip(r) for r in map(_REASON, verdicts)]  # one per state; each bounded (input in it)
        states = groups.inverse
        hopeless_mask = ~fits & unresolvable[states]
        failed_mask = ~fits & ~hopeless_mask
        rejected: dict[str, int] = {}
        per_state = np.bincount(states[~fits], minlength=len(verdicts)).tolist()
        for reason, count in zip(reasons, per_state, strict=True):
            if count:
                rejected[reason] = rejected.get(reason, 0) + count
        failed = RejectedNames(names, failed_mask, states, reasons)
        hopeless = RejectedNames(names, hopeless_mask, states, reasons)
        return Filtered(fits, failed, hopeless, rejected)


def held_per_state(verdicts: Sequence[Verdict]) -> np.ndarray:
    """Devices held on each state's nodes when decided (the shortlist's fullness)."""
    return np.fromiter(map(_HELD, verdicts), dtype=np.int64, count=len(verdicts))


@dataclass(frozen=True)
class _HashTable:
    """The cache's names sorted by hash: ``hashes[i]`` is the hash of the name in slot
    ``order[i]``; ``tokens[slot]`` is that name's token now (written in place)."""

    hashes: np.ndarray
    order: np.ndarray
    tokens: np.ndarray
    slots: dict[str, int]
    unique: bool  # no two names share a hash (else lookups take the dict)


_EMPTY = _HashTable(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64), {}, True)


class TokenIndex:
    """Name -> memo token: a dict for single lookups, and for filter's whole name list a lookup
    by the names' hashes in a sorted numpy array.

    kube-scheduler lists the feasible nodes in the order its 16 filter goroutines finish, a new
    order for every pod, so a dict lookup per name lands all over memory: about 9 ms at 15,000
    freshly decoded names. Hashing the fresh names walks them in the order they were decoded,
    and a binary search in the sorted hashes (120 KiB at 15,000 nodes) stays in cache. The table
    is rebuilt when the set of names changed since (at the next lookup, not per node of a sync);
    a token change is written in place. Names are matched by their 64-bit string hash, whose
    key is random per process; if two of the cache's names ever share one, the dict is used."""

    def __init__(self) -> None:
        self._tokens: dict[str, int] = {}
        self._table = _EMPTY
        self._stale = False  # names came or went since the table was built
        self._lock = threading.Lock()

    def mapping(self) -> Mapping[str, int]:
        """The live name -> token map (do not mutate)."""
        return self._tokens

    def set(self, name: str, token: int) -> None:
        with self._lock:
            self._tokens[name] = token
            slot = self._table.slots.get(name)
            if slot is None:
                self._stale = True
            else:
                self._table.tokens[slot] = token

    def drop(self, name: str) -> None:
        with self._lock:
            if self._tokens.pop(name, None) is not None:
                self._stale = True

    def keys(self, names: list[str]) -> np.ndarray:
        """The names' tokens as int64, -1 for a name with none (``StateGroups.of`` takes them)."""
        table = self._current()
        if not table.unique or not len(table.hashes):
            return np.fromiter(map(self._tokens.get, names, repeat(-1)), dtype=np.int64, count=len(names))
        wanted = np.fromiter(map(hash, names), dtype=np.int64, count=len(names))
        at = np.minimum(np.searchsorted(table.hashes, wanted), len(table.hashes) - 1)
        tokens: np.ndarray = np.where(table.hashes[at] == wanted, table.tokens[table.order[at]], -1)
        return tokens

    def _current(self) -> _HashTable:
        if not self._stale:
            return self._table
        with self._lock:
            if self._stale:
                names = list(self._tokens)
                hashes = np.fromiter(map(hash, names), dtype=np.int64, count=len(names))
                order = np.argsort(hashes, kind="stable")
                ordered = hashes[order]
                self._table = _HashTable(
                    hashes=ordered,
                    order=order,
                    tokens=np.fromiter(self._tokens.values(), dtype=np.int64, count=len(names)),
                    slots={name: slot for slot, name in enumerate(names)},
                    unique=bool(len(ordered) < 2 or (ordered[1:] != ordered[:-1]).all()),
                )
                self._stale = False
            return self._table
