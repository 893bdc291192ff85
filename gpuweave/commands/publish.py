"""`gpuweave publish`: print the objects the node agent would publish for a node"""

from __future__ import annotations

import argparse
from typing import Any

from topology.errors import GpuweaveError


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "publish",
        help="print the objects the node agent would publish for a node",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    raise GpuweaveError("`gpuweave publish` is not available in this build yet")
