"""The ``gpuweave`` command line: one sub-command module per verb under ``gpuweave.commands``.

Each command module exposes ``register(subparsers)`` which adds its parser and sets
``handler`` (a callable taking the parsed namespace and returning an exit code). Errors derived
from ``GpuweaveError`` print as one line on stderr with exit code 2; no traceback. Log records
and those lines are escaped and clipped (``devicemodel.text``): they may quote a pod's text.
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
from devicemodel.text import MAX_SHOWN_CHARS, EscapingFormatter, safe_text
from gpuweave import __version__

# Imported on demand: a long-running command (the node agent) then loads only its own
# dependencies, which keeps its start-up time and resident memory down.
COMMAND_MODULE_NAMES = (
    "simulate", "inspect", "node_agent", "publish", "extender", "sim", "mig", "status", "gpu_check", "check",
    "exercise", "uninstall", "lifecycle",
)

Handler = Callable[[argparse.Namespace], int]
LOG_LEVEL_HELP = "logging level: DEBUG, INFO, WARNING, ERROR (default WARNING); before or after the command"


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
    parser.add_argument("--log-level", default="WARNING", help=LOG_LEVEL_HELP)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in (only,) if only else COMMAND_MODULE_NAMES:
        importlib.import_module(f"gpuweave.commands.{name}").register(subparsers)
    _log_level_everywhere(parser)
    return parser


def _log_level_everywhere(parser: argparse.ArgumentParser) -> None:
    """``--log-level`` after any sub-command too (``gpuweave node-agent ... --log-level INFO``, as
    a chart's extraArgs append it). SUPPRESS: a sub-command sets it only when it is given there,
    so a level given before the sub-command stands otherwise."""
    for action in parser._actions:  # argparse has no public view of its sub-parsers
        if not isinstance(action, argparse._SubParsersAction):
            continue
        for sub in dict.fromkeys(action.choices.values()):  # aliases name one parser twice
            sub.add_argument("--log-level", default=argparse.SUPPRESS, help=LOG_LEVEL_HELP)
            _log_level_everywhere(sub)


def log_level(name: str) -> int | None:
    """The logging level ``name`` names (any case), None for a name that is no level."""
    level = logging.getLevelName(name.upper())
    return level if isinstance(level, int) else None


def log_to_stderr(level: int) -> None:
    """The process's one log handler: every message through ``devicemodel.text`` (escaped, one
    line, clipped), since pod names, annotations and selectors reach log lines."""
    handler = logging.StreamHandler()
    handler.setFormatter(EscapingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level, handlers=[handler])


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(only=_command_named(arguments))
    args = parser.parse_args(arguments)
    level = log_level(str(args.log_level))
    log_to_stderr(logging.WARNING if level is None else level)
    if level is None:  # a typo in a level never stops a command (a DaemonSet's agent): said, then WARNING
        logging.getLogger("gpuweave").warning(
            "unknown --log-level %s; logging at WARNING (give DEBUG, INFO, WARNING or ERROR)", args.log_level
        )
    handler = cast(Handler, args.handler)
    try:
        return handler(args)
    except GpuweaveError as exc:  # its message may quote a pod's or a file's text: escaped, one line
        print(f"gpuweave {args.command}: {safe_text(str(exc), limit=MAX_SHOWN_CHARS)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `gpuweave status | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 141
