"""Which sharing configuration a node agent serves: its Node's named one, or the default.

``--sharing-config FILE`` is the default (without it every GPU is offered whole).
``--sharing-config-dir DIR`` holds named configurations, ``<name>.yaml`` each; a Node labelled
``gpuweave.io/sharing-config=<name>`` is served with that one, so one cluster mixes nodes whose
GPUs are whole, fractional or time-sliced (the chart's ``nodeAgent.sharingConfigs``). The label is
read once, at start, from the agent's own Node: a relabelled node takes its new configuration
when its agent restarts. A label that names no configuration stops the start in one line, as a
bad file does; a Node the API server does not answer for within ``LABEL_READ_ATTEMPTS`` tries
stops it too (the sharing of every GPU depends on the answer).
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from devicemodel.contracts import LABEL_SHARING_CONFIG
from devicemodel.errors import GpuweaveError
from devicemodel.sharing import named_sharing_file
from kubeio.errors import describe

log = logging.getLogger(__name__)
LABEL_READ_ATTEMPTS = 6  # over about 30 s (1, 2, 4, 8, 15 s apart)
LABEL_READ_CAP_S = 15.0

NodeLabels = Callable[[], dict[str, str]]  # the agent's Node's labels (raises on API failure)


def add_sharing_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sharing-config", type=Path, default=None, help="per-GPU sharing YAML (kind SharingConfig)"
    )
    parser.add_argument(
        "--sharing-config-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help=f"named sharing configurations, <name>.yaml each: a Node labelled {LABEL_SHARING_CONFIG}=<name> "
        "is served with that one, others with --sharing-config (read at start; needs the API server; "
        "docs/device-plugin.md)",
    )


def check_sharing_arguments(args: argparse.Namespace, *, with_kube: bool) -> None:
    directory = args.sharing_config_dir
    if directory is None:
        return
    if not with_kube:
        raise GpuweaveError(
            f"--sharing-config-dir needs the Node's {LABEL_SHARING_CONFIG} label: give --kubeconfig too "
            "(or --in-cluster)"
        )
    if not directory.is_dir():
        raise GpuweaveError(f"--sharing-config-dir {directory} is not a directory")


def node_labels_of(api: Any, node: str) -> NodeLabels:
    """The labels of Node ``node`` through ``api`` (a kubernetes ``ApiClient``)."""
    from kubernetes import client  # noqa: PLC0415 (only with an API server)

    def labels() -> dict[str, str]:
        found = client.CoreV1Api(api).read_node(node)
        return dict((found.metadata.labels if found.metadata else None) or {})

    return labels


def chosen_sharing_config(
    args: argparse.Namespace, *, labels: NodeLabels | None, sleep: Callable[[float], None] = time.sleep
) -> Path | None:
    """The sharing file this node's agent serves: the named one its Node's label picks (with
    ``--sharing-config-dir``), else ``--sharing-config`` (None: every GPU whole)."""
    default: Path | None = args.sharing_config
    directory: Path | None = args.sharing_config_dir
    if directory is None or labels is None:
        return default
    name = _read_label(labels, sleep=sleep)
    if name is None:
        log.info("node has no %s label: serving the default sharing configuration", LABEL_SHARING_CONFIG)
        return default
    chosen = named_sharing_file(directory, name, label=LABEL_SHARING_CONFIG)
    log.warning("node label %s=%s: serving sharing configuration %s", LABEL_SHARING_CONFIG, name, chosen)
    return chosen


def _read_label(labels: NodeLabels, *, sleep: Callable[[float], None]) -> str | None:
    delay, problem = 1.0, ""
    for attempt in range(LABEL_READ_ATTEMPTS):
        try:
            return labels().get(LABEL_SHARING_CONFIG)
        except Exception as exc:  # an API outage at start: tried again, then the start stops
            problem = describe(exc)
            if attempt + 1 < LABEL_READ_ATTEMPTS:
                log.warning("cannot read the node's labels (%s); trying again in %.0f s", problem, delay)
                sleep(delay)
                delay = min(delay * 2, LABEL_READ_CAP_S)
    raise GpuweaveError(
        f"cannot read the node's {LABEL_SHARING_CONFIG} label after {LABEL_READ_ATTEMPTS} tries ({problem}); "
        "the sharing configuration depends on it: check the API server and the agent's RBAC (get nodes)"
    )
