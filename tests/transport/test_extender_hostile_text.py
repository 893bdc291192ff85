"""Text a pod wrote, as the extender sends it back over real HTTP on 127.0.0.1: a gang name or a
gpu-selector carrying terminal escapes and bidi overrides reaches filter's reasons (which
kube-scheduler copies into its FailedScheduling Event) escaped, visibly, and clipped."""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devicemodel.contracts import ANNOTATION_GPU_SELECTOR, RESOURCE_GPU
from devicemodel.errors import MAX_REASON_CHARS
from devicemodel.gangs import ANNOTATION_GANG, ANNOTATION_GANG_SIZE
from devicemodel.text import ESCAPED_CATEGORIES
from gpuweave.simulate.cluster_objects import (
    cluster_list,
    inventory_object,
    node_object,
    pod_object,
    profile_inventory,
)
from scheduler_ext.app import Extender, build_snapshot_extender
from tests.transport.test_extender_http import Client

NAMES = [f"gpu-{i}" for i in range(3)]
GANG = "train\x1b[2J\x1b]0;pwned\x07\u202egpj.exe"


def raw_controls(text: str) -> list[str]:
    return [c for c in text if unicodedata.category(c) in ESCAPED_CATEGORIES]


@pytest.fixture
def client(tmp_path: Path) -> Iterator[Client]:
    items: list[dict[str, Any]] = []
    for name in NAMES:
        items += [node_object(name, gpus=8), inventory_object(profile_inventory("dgx-h100", name))]
    snapshot = tmp_path / "cluster.json"
    snapshot.write_text(json.dumps(cluster_list(items)))
    built: Extender = build_snapshot_extender(snapshot)
    try:
        made = Client(built.serve(host="127.0.0.1", port=0).removeprefix("http://"))
        yield made
        made.close()
    finally:
        built.close()


def _reasons(client: Client, pod: dict[str, Any]) -> list[str]:
    status, answer = client.post("filter", {"Pod": pod, "NodeNames": NAMES})
    assert status == 200, answer
    rejected = {**(answer["FailedNodes"] or {}), **(answer["FailedAndUnresolvableNodes"] or {})}
    assert rejected, answer
    return list(rejected.values())


def test_a_gang_name_with_escapes_reaches_filter_reasons_escaped(client: Client) -> None:
    """Member 0 of a gang of 2 is planned on one node; the others are refused naming the gang."""
    pod = pod_object(
        "member-0", limits={RESOURCE_GPU: 8}, annotations={ANNOTATION_GANG: GANG, ANNOTATION_GANG_SIZE: "2"}
    )
    reasons = _reasons(client, pod)
    for reason in reasons:
        assert raw_controls(reason) == [], reason
        assert "train\\x1b[2J\\x1b]0;pwned\\x07\\u202egpj.exe" in reason  # visible, nothing dropped


def test_a_cel_parser_message_quoting_a_control_character_is_escaped(client: Client) -> None:
    """The CEL parser's own words name the token it could not read: here a bidi override."""
    selector = "1 == 1 \u202e\x1b[2J" + "x" * 2000
    pod = pod_object("selector", limits={RESOURCE_GPU: 1}, annotations={ANNOTATION_GPU_SELECTOR: selector})
    for reason in _reasons(client, pod):
        assert "does not compile" in reason and len(reason) <= MAX_REASON_CHARS
        assert raw_controls(reason) == [], reason
        assert "\\u202e" in reason
