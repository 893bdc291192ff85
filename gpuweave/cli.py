"""The ``gpuweave`` command line: one sub-command module per verb under ``gpuweave.commands``.

Each command module exposes ``register(subparsers)`` which adds its parser and sets
``handler`` (a callable taking the parsed namespace and returning an exit code). Errors derived
from ``GpuweaveError`` print as one line on stderr with exit code 2; no traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from typing import cast

from gpuweave import __version__
from gpuweave.commands import extender, inspect, mig, node_agent, publish, sim, simulate
from topology.errors import GpuweaveError

COMMAND_MODULES = (simulate, inspect, node_agent, publish, extender, sim, mig)

Handler = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuweave",
        description="Share GPUs in Kubernetes and place GPU work by hardware topology.",
    )
    parser.add_argument("--version", action="version", version=f"gpuweave {__version__}")
    parser.add_argument("--log-level", default="WARNING", help="Python logging level (default WARNING)")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMAND_MODULES:
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.WARNING),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    handler = cast(Handler, args.handler)
    try:
        return handler(args)
    except GpuweaveError as exc:
        print(f"gpuweave {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
