"""The ``gpuweave`` command line: one sub-command module per verb under ``gpuweave.commands``.

Each command module exposes ``register(subparsers)`` which adds its parser and sets
``handler`` (a callable taking the parsed namespace and returning an exit code). Errors derived
from ``GpuweaveError`` print as one line on stderr with exit code 2; no traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import cast

from devicemodel.errors import GpuweaveError
from gpuweave import __version__

# Imported on demand: a long-running command (the node agent) then loads only its own
# dependencies, which keeps its start-up time and resident memory down.
COMMAND_MODULE_NAMES = (
    "simulate", "inspect", "node_agent", "publish", "extender", "sim", "mig", "status", "gpu_check", "check",
    "lifecycle",
)

Handler = Callable[[argparse.Namespace], int]


def _command_named(argv: Sequence[str]) -> str | None:
    """The command module the arguments name (``node-agent`` -> ``node_agent``), if any."""
    for arg in argv:
        name = arg.replace("-", "_")
        if name in COMMAND_MODULE_NAMES:
            return name
    return None


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuweave",
        description="Share GPUs in Kubernetes and place GPU work by hardware topology.",
    )
    parser.add_argument("--version", action="version", version=f"gpuweave {__version__}")
    parser.add_argument("--log-level", default="WARNING", help="Python logging level (default WARNING)")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in (only,) if only else COMMAND_MODULE_NAMES:
        importlib.import_module(f"gpuweave.commands.{name}").register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(only=_command_named(arguments))
    args = parser.parse_args(arguments)
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
    except BrokenPipeError:  # `gpuweave status | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 141
