"""`gpuweave publish`: print the objects the node agent would publish for a node.

The same builders the running agent uses (``nodeagent.published``): the cluster-scoped
``GpuNodeInventory`` named after the node and the Node's GFD-compatible labels, printed as a
Kubernetes ``List`` in YAML (or JSON with ``--json``), all devices healthy.

With ``--dra`` it prints instead the node's ``resource.k8s.io/v1`` ResourceSlices as the agent's DRA
mode publishes them (``dradriver``): YAML, one document per slice (a ``List`` with
``--json``); ``--dra-mig dynamic`` publishes MIG-capable GPUs as partitionable devices, and a
``--sharing-config`` that makes a GPU fractional publishes it as one device claims share
(docs/dra.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from devicemodel.errors import GpuweaveError
from devicemodel.sharing import SharingPlan, load_sharing_plan
from dradriver.devices import MigPublishing
from dradriver.slices import pool_slices
from gpuweave.node.flags import add_dra_mig_argument
from hardware.profiles import load_profile
from hardware.simulated.backend import SimulatedBackend
from nodeagent.published import published_list


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "publish",
        help="print the objects the node agent would publish for a node",
        description="Print the GpuNodeInventory resource and node labels the agent publishes, as a List.",
    )
    parser.add_argument("--simulate", metavar="PROFILE|FILE", help="built-in profile or YAML file")
    parser.add_argument("--node-name", default=None, help="node name (default: the profile's name)")
    parser.add_argument("--sharing-config", type=Path, default=None, help="per-GPU sharing YAML")
    parser.add_argument("--json", action="store_true", help="print JSON instead of YAML")
    parser.add_argument(
        "--dra",
        action="store_true",
        help="print the node's DRA ResourceSlices (resource.k8s.io/v1) instead, one YAML document each",
    )
    add_dra_mig_argument(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if not args.simulate:
        raise GpuweaveError("publish needs --simulate PROFILE|FILE (reading real GPUs is not in this build)")
    profile = load_profile(args.simulate)
    backend = SimulatedBackend(profile, node_name=args.node_name or profile.name)
    try:  # discovered as the agent discovers it, so a GPU lost in the profile is left out here too
        inventory = backend.discover()
    finally:
        backend.close()
    sharing = load_sharing_plan(args.sharing_config) if args.sharing_config else SharingPlan()
    if args.dra:
        slices = pool_slices(inventory, mig=MigPublishing(args.dra_mig), sharing=sharing)
        return _print_slices(slices, as_json=args.json)
    objects = published_list(inventory, sharing=sharing)
    if args.json:
        json.dump(objects, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        yaml.safe_dump(objects, sys.stdout, sort_keys=False)
    return 0


def _print_slices(slices: list[dict[str, Any]], *, as_json: bool) -> int:
    if as_json:
        json.dump({"apiVersion": "v1", "kind": "List", "items": slices}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        yaml.safe_dump_all(slices, sys.stdout, sort_keys=False)
    return 0
