"""`gpuweave simulate`: run a simulated GPU cluster with the real components and report (the main job)"""

from __future__ import annotations

import argparse
from typing import Any

from topology.errors import GpuweaveError


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "simulate",
        help="run a simulated GPU cluster with the real components and report (the main job)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    raise GpuweaveError("`gpuweave simulate` is not available in this build yet")
