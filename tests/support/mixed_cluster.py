"""A small mixed cluster as a snapshot file: two 8-GPU H100 nodes, one 4-GPU A100 PCIe node and a
node with no GPUs, for extender tests that read the snapshot the way ``gpuweave extender`` does."""

from __future__ import annotations

import json
from pathlib import Path

from gpuweave.simulate.cluster_objects import cluster_list, inventory_object, node_object, profile_inventory

PROFILES = {"h100-a": "p5.48xlarge", "h100-b": "p5.48xlarge", "pcie-4": "a100-pcie-nvbridge-4"}


def mixed_cluster_snapshot(directory: Path) -> Path:
    """Write the cluster as a Kubernetes List into ``directory``; returns the file."""
    items = [node_object("cpu-only")]
    for name, profile in PROFILES.items():
        inventory = profile_inventory(profile, name)
        items += [node_object(name, gpus=len(inventory.gpus)), inventory_object(inventory)]
    path = directory / "cluster.json"
    path.write_text(json.dumps(cluster_list(items)))
    return path
