"""`gpuweave sim`: act on a running simulated node agent (fault injection)"""

from __future__ import annotations

import argparse
from typing import Any

from topology.errors import GpuweaveError


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "sim",
        help="act on a running simulated node agent (fault injection)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    raise GpuweaveError("`gpuweave sim` is not available in this build yet")
