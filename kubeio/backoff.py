"""Bounded exponential back-off with jitter, for retrying API calls that failed.

Jitter spreads the retries of many clients (every node agent after an API server restart) so they
do not arrive together; the bound keeps a long outage from stretching the wait past ``max_s``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class Backoff:
    """``next()`` gives initial_s, 2x, 4x ... up to max_s, each scaled by 1 +/- jitter; ``reset()``
    after a success starts again from initial_s."""

    initial_s: float = 0.5
    max_s: float = 30.0
    factor: float = 2.0
    jitter: float = 0.2
    rng: random.Random = field(default_factory=random.Random)
    _failures: int = 0

    def next(self) -> float:
        base = min(self.max_s, self.initial_s * self.factor**self._failures)
        self._failures = min(self._failures + 1, 64)
        return min(self.max_s, base * (1 + self.rng.uniform(-self.jitter, self.jitter)))

    def reset(self) -> None:
        self._failures = 0
