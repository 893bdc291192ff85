"""kubeio's retry back-off: doubles from the first delay up to the bound, jittered, reset by a success."""

from __future__ import annotations

import random

from kubeio.backoff import Backoff


def test_delays_double_up_to_the_bound_within_the_jitter() -> None:
    backoff = Backoff(initial_s=0.5, max_s=4.0, jitter=0.2, rng=random.Random(7))
    delays = [backoff.next() for _ in range(8)]
    for delay, base in zip(delays, (0.5, 1.0, 2.0, 4.0, 4.0, 4.0, 4.0, 4.0), strict=True):
        assert base * 0.8 <= delay <= min(4.0, base * 1.2)
    assert len({round(d, 6) for d in delays[3:]}) > 1  # jittered: the retries of many clients spread


def test_reset_starts_again_from_the_first_delay() -> None:
    backoff = Backoff(initial_s=1.0, max_s=30.0, jitter=0.0)
    assert [backoff.next() for _ in range(3)] == [1.0, 2.0, 4.0]
    backoff.reset()
    assert backoff.next() == 1.0
