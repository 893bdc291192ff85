"""The ``--dra-mig`` flag, shared by ``gpuweave node-agent --dra`` and ``gpuweave publish --dra``."""

from __future__ import annotations

import argparse

from dradriver.devices import MigPublishing


def add_dra_mig_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dra-mig",
        choices=[m.value for m in MigPublishing],
        default=MigPublishing.STATIC.value,
        help="with --dra: static publishes the MIG devices that exist; dynamic publishes MIG-capable GPUs "
        "as partitionable devices (shared counters, every placement; docs/dra.md). Default: static",
    )
