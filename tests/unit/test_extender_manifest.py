"""The KubeSchedulerConfiguration shipped in manifests/scheduler/ stays valid and in sync."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from topology.contracts import (
    RESOURCE_EFA,
    RESOURCE_GPU,
    RESOURCE_GPU_COMPUTE,
    RESOURCE_GPU_MEMORY,
    RESOURCE_GPU_SHARED,
    mig_resource_name,
)
from topology.mig_catalog import default_catalog

CONFIG = Path(__file__).parents[2] / "manifests" / "scheduler" / "scheduler-config.yaml"
# Extended resource names: a DNS-1123 prefix, "/", and a qualified name (no "+").
RESOURCE_NAME = re.compile(r"^[a-z0-9.-]+/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def _extender() -> dict[str, Any]:
    config = yaml.safe_load(CONFIG.read_text())
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["kind"] == "KubeSchedulerConfiguration"
    (extender,) = config["extenders"]
    return dict(extender)


def test_extender_uses_every_verb_and_names_only() -> None:
    extender = _extender()
    assert {extender[k] for k in ("filterVerb", "prioritizeVerb", "preemptVerb", "bindVerb")} == {
        "filter",
        "prioritize",
        "preempt",
        "bind",
    }
    assert extender["nodeCacheCapable"] is True
    assert extender["enableHTTPS"] is False
    assert extender["weight"] > 0  # kube-scheduler rejects a prioritizeVerb with weight 0


def test_managed_resources_cover_our_names_and_ignore_only_the_shares() -> None:
    managed = {m["name"]: m["ignoredByScheduler"] for m in _extender()["managedResources"]}
    assert all(RESOURCE_NAME.match(name) for name in managed)
    ignored = {name for name, flag in managed.items() if flag}
    assert ignored == {RESOURCE_GPU_COMPUTE, RESOURCE_GPU_MEMORY, RESOURCE_GPU_SHARED}
    assert managed[RESOURCE_GPU] is False and managed[RESOURCE_EFA] is False
    profiles = {p.name for model in default_catalog().models for p in model.profiles}
    assert {mig_resource_name(p) for p in profiles} <= set(managed)
