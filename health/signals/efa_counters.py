"""EFA health from the adapter's hardware counters: the only view of an EFA link.

The efa driver hard-codes its verbs port to ACTIVE/LinkUp and an EFA-only interface has no netdev,
so port state and ``operstate`` miss a failed adapter; its counters do not. Between two rounds:

- ``no_completion_cmds`` rising means the device stopped completing admin commands: the adapter
  is down (fatal, as NVSentinel grades it) until its counters start over (a driver reload or an
  adapter reset) or it disappears;
- ``keep_alive_rcvd`` that advanced before and then stands still for ``keepalive_stall_s``: the
  device stopped sending keep-alives, also down;
- error counters (failed work requests, SRD retransmit timeouts, unresponsive or impaired remotes,
  admin errors) rising faster than ``error_rate_per_s``: degraded, reported but not failed (the
  rate is NMA's warning threshold for error counters).

Pure: adapters and a time in, a verdict out; the previous round is the only state.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from hardware.health_probe import EfaAdapter

FATAL_COUNTERS = ("no_completion_cmds",)
KEEP_ALIVE = "keep_alive_rcvd"
ERROR_COUNTERS = (
    "cmds_err", "rdma_read_wr_err", "rdma_write_wr_err", "retrans_timeout_events",
    "unresponsive_remote_events", "impaired_remote_conn_events", "alloc_pd_err", "create_qp_err",
    "create_cq_err", "reg_mr_err", "alloc_ucontext_err", "create_ah_err", "mmap_err",
)
DEFAULT_KEEPALIVE_STALL_S = 30.0
DEFAULT_ERROR_RATE_PER_S = 100.0


@dataclass(frozen=True)
class EfaCounterVerdict:
    down: dict[str, str] = field(default_factory=dict)  # adapter -> reason
    degraded: dict[str, str] = field(default_factory=dict)


@dataclass
class _Seen:
    counters: Mapping[str, int]
    at: float
    keep_alive_at: float  # when keep_alive_rcvd last advanced
    keep_alive_moved: bool = False


class EfaCounterWatch:
    """Compares each round's counters with the last; adapters without counters are left alone."""

    def __init__(
        self,
        *,
        keepalive_stall_s: float = DEFAULT_KEEPALIVE_STALL_S,
        error_rate_per_s: float = DEFAULT_ERROR_RATE_PER_S,
    ) -> None:
        self._stall_s = keepalive_stall_s
        self._rate = error_rate_per_s
        self._seen: dict[str, _Seen] = {}
        self._failed: dict[str, str] = {}

    def observe(self, adapters: Iterable[EfaAdapter], *, at: float) -> EfaCounterVerdict:
        verdict = EfaCounterVerdict()
        present = {a.name: a for a in adapters if a.counters}
        for gone in set(self._seen) - set(present):
            self._seen.pop(gone)
            self._failed.pop(gone, None)
        for name, adapter in present.items():
            self._observe_one(name, adapter.counters, at=at, verdict=verdict)
        verdict.down.update(self._failed)
        return verdict

    def _observe_one(
        self, name: str, now: Mapping[str, int], *, at: float, verdict: EfaCounterVerdict
    ) -> None:
        before = self._seen.get(name)
        if before is None or any(now.get(k, 0) < v for k, v in before.counters.items()):
            self._seen[name] = _Seen(now, at, at)  # first sight, or the counters started over
            self._failed.pop(name, None)
            return
        delta = {k: now.get(k, 0) - v for k, v in before.counters.items()}
        fatal = [f"{k} +{delta[k]}" for k in FATAL_COUNTERS if delta.get(k, 0) > 0]
        if fatal:
            self._failed[name] = f"EFA {name}: {', '.join(fatal)} (the adapter stopped completing commands)"
        if delta.get(KEEP_ALIVE, 0) > 0:
            before.keep_alive_at, before.keep_alive_moved = at, True
        elif before.keep_alive_moved and at - before.keep_alive_at >= self._stall_s:
            verdict.down[name] = f"EFA {name}: no keep-alive for {at - before.keep_alive_at:.0f} s"
        elapsed = max(at - before.at, 1e-9)
        errors = {k: delta[k] for k in ERROR_COUNTERS if delta.get(k, 0) > 0}
        if errors and sum(errors.values()) / elapsed > self._rate:
            listed = ", ".join(f"{k} +{v}" for k, v in sorted(errors.items()))
            verdict.degraded[name] = f"EFA {name}: {listed} in {elapsed:.0f} s"
        before.counters, before.at = now, at
