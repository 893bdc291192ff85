"""When an idle GPU is checked between jobs (pure: observations in, the GPUs due out).

The agent looks at which GPUs pods hold once a round (``observe``): a GPU seen free is idle since
then, one seen held is not idle, and a GPU that was held and is free now had a job end on it.
``due`` then picks the GPUs to check now, at most ``max_gpus``:

- only Healthy GPUs nothing holds, idle for at least ``settle_s`` (the next job of a queue, which
  the kubelet places within seconds of the last one's end, goes first: a check never races it);
- a GPU is due when its last check (any run that judged it, the burn-in included) is at least
  ``interval_s`` old or it was never checked, or, with ``after_job``, when a job ended on it after
  its last check;
- GPUs whose job just ended first, then the longest unchecked, then in the order given (the
  inventory's: neighbours are taken together, so an NVLink pair is measured in the same run).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from health.config import IdleSettings


@dataclass(frozen=True)
class GpuIdle:
    """What the rounds saw of one GPU: free since when (None while a pod holds it), and when a job
    on it was last seen ended (None: none since the agent started)."""

    idle_since: float | None = None
    job_ended_at: float | None = None


def observe(
    before: Mapping[str, GpuIdle], gpus: Sequence[str], *, held: Collection[str], now: float
) -> dict[str, GpuIdle]:
    """The GPUs' record after one look at what pods hold (``held``: GPU UUIDs)."""
    after = {}
    for uuid in gpus:
        last = before.get(uuid)
        if uuid in held:
            after[uuid] = GpuIdle(None, last.job_ended_at if last is not None else None)
        elif last is None:
            after[uuid] = GpuIdle(now, None)  # first look: no job seen ending
        elif last.idle_since is None:
            after[uuid] = GpuIdle(now, now)  # held last time, free now: its job ended
        else:
            after[uuid] = last
    return after


def due(
    seen: Mapping[str, GpuIdle],
    gpus: Sequence[str],
    *,
    healthy: Collection[str],
    last_checked: Mapping[str, float],
    now: float,
    settings: IdleSettings,
) -> list[str]:
    """The GPUs to check now, in ``gpus``' terms, at most ``settings.max_gpus`` (see the module)."""
    if not settings.enabled:
        return []
    ready: list[tuple[int, float, float, int, str]] = []
    for order, uuid in enumerate(gpus):
        idle = seen.get(uuid)
        if uuid not in healthy or idle is None or idle.idle_since is None:
            continue
        if now - idle.idle_since < settings.settle_s:
            continue
        checked = last_checked.get(uuid)
        ended = idle.job_ended_at
        after_job = settings.after_job and ended is not None and (checked is None or ended > checked)
        periodic = settings.interval_s > 0 and (checked is None or now - checked >= settings.interval_s)
        if after_job or periodic:
            since = float("-inf") if checked is None else checked
            first = (0, ended or 0.0) if after_job else (1, 0.0)
            ready.append((*first, since, order, uuid))
    ready.sort()
    return [uuid for *_, uuid in ready[: settings.max_gpus]]
