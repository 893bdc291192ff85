"""`gpuweave inspect`: print a node's GPU inventory and topology matrix"""

from __future__ import annotations

import argparse
from typing import Any

from topology.errors import GpuweaveError


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "inspect",
        help="print a node's GPU inventory and topology matrix",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    raise GpuweaveError("`gpuweave inspect` is not available in this build yet")
