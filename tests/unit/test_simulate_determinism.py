"""The same seed gives the same report under any machine load.

The simulation's node agents run real threads (NVML event listener, the kubelets' ListAndWatch
streams, a GPU reset); nothing the simulation decides may hang on how fast they run
(``gpuweave.simulate.agents``). One short run with agents and faults (an Xid, an ECC error whose
GPU comes back through the agent's reset and probation rounds, an EFA loss), run alone and then
next to processes spinning on every core, must give the same figures (``simulated_figures``:
all but the wall-clock measurements).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuweave.simulate.report import simulated_figures

pytestmark = pytest.mark.slow

SPIN = "import sys, time\nend = time.monotonic() + float(sys.argv[1])\nwhile time.monotonic() < end: pass\n"
RUN = ["simulate", "--nodes", "4", "--duration", "1h", "--seed", "7", "--no-compare", "--no-progress"]


@contextlib.contextmanager
def busy_cores(seconds: float) -> Iterator[int]:
    """A process spinning on each core this test may use (at most 8), for at most ``seconds``."""
    cores = min(len(os.sched_getaffinity(0)), 8)
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN, str(seconds)]) for _ in range(cores)]
    try:
        yield cores
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def _run(out: Path) -> dict[str, Any]:
    argv = [sys.executable, "-m", "gpuweave", *RUN, "--out", str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "health.monitor" not in done.stderr  # the agents' transitions are the report's fault lines
    return simulated_figures(json.loads((out / "report.json").read_text()))


def _differences(a: Any, b: Any, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        keys = sorted(a.keys() | b.keys())
        return [d for k in keys for d in _differences(a.get(k), b.get(k), f"{path}/{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        pairs = enumerate(zip(a, b, strict=True))
        return [d for i, (x, y) in pairs for d in _differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def test_a_seed_gives_the_same_report_alone_and_next_to_a_busy_loop(tmp_path: Path) -> None:
    quiet = _run(tmp_path / "quiet")
    with busy_cores(600.0):
        loaded = _run(tmp_path / "loaded")
    faults = quiet["summaries"][0]["faults"]
    assert any(f["health_rounds"] for f in faults), faults  # a GPU came back through the agent's rounds
    assert quiet["summaries"][0]["node_agents"] == "4 agents (gRPC)"
    assert _differences(quiet, loaded) == []
