"""`gpuweave node-agent`: run the node agent: device plugin servers, health, MIG, publishing"""

from __future__ import annotations

import argparse
from typing import Any

from topology.errors import GpuweaveError


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "node-agent",
        help="run the node agent: device plugin servers, health, MIG, publishing",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    raise GpuweaveError("`gpuweave node-agent` is not available in this build yet")
