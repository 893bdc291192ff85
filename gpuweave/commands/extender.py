"""`gpuweave extender`: run the kube-scheduler extender"""

from __future__ import annotations

import argparse
from typing import Any

from topology.errors import GpuweaveError


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "extender",
        help="run the kube-scheduler extender",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    raise GpuweaveError("`gpuweave extender` is not available in this build yet")
