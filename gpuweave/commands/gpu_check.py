"""`gpuweave gpu-check`: the read-only check of a real NVIDIA host, or of the simulator.

The steps live in ``gpuweave.gpucheck.check``; ``scripts/gpu-check`` in the repository runs this
command with the repository's Python. docs/gpu-check.md.
"""

from __future__ import annotations

import argparse
from typing import Any

from gpuweave.gpucheck import check


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "gpu-check",
        help="read-only check of this NVIDIA host (or the simulator): contract, inspect, agent, exercise, "
        "record",
        description=(
            "Check this host's GPUs without changing anything: the repository's backend contract "
            "suite (when run from a checkout with pytest; otherwise reported as skipped), gpuweave "
            "inspect, the node agent against a kubelet, the active-check exerciser on every GPU "
            "(recorded), and a recording of every NVML answer the product reads. --simulate PROFILE "
            "checks the simulator instead. Exit 0 when no step failed."
        ),
    )
    check.add_arguments(parser)
    parser.set_defaults(handler=check.run)
