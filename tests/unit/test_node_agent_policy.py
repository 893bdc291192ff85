"""manifests/admission-node-agent.yaml names, in CEL, what the node agent writes; these tests hold
those lists to the code that writes it, so a label, taint, condition or gang marker added to the
agent cannot be refused by the API server unnoticed (tests/e2e/test_e2e_node_agent_policy.py runs
the policies on a real kube-apiserver)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from devicemodel.contracts import ANNOTATION_OPT_OUT_EVICTION
from devicemodel.gangs import (
    ANNOTATION_GANG,
    ANNOTATION_GANG_EVICTION,
    LABEL_JOBSET_NAME,
    LABEL_KUEUE_POD_GROUP,
    LABEL_POD_GROUP,
    LABEL_REPLICATED_JOB,
)
from gpuweave.simulate.cluster_objects import profile_inventory
from hardware.profiles import builtin_profile_names
from health.kube import CORDON_ANNOTATION, EVICTION_LABEL
from health.scope import (
    AGENT_CONDITIONS,
    TAINT_HEALTH_PENDING,
    TAINT_NODE_FAULT,
)
from nodeagent.published import AGENT_LABEL_KEYS, node_labels

MANIFEST = Path(__file__).parents[2] / "manifests" / "admission-node-agent.yaml"
AGENT = "system:serviceaccount:gpuweave-system:gpuweave-node-agent"


def _policies() -> dict[str, dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"}


def _variable(policy: str, name: str) -> str:
    variables = {v["name"]: v["expression"] for v in _policies()[policy]["spec"]["variables"]}
    return str(variables[name])


def _strings(expression: str) -> set[str]:
    return set(re.findall(r"'([^']*)'", expression))


@pytest.mark.parametrize("profile", builtin_profile_names())
def test_every_label_the_agent_publishes_is_one_the_policy_lets_it_change(profile: str) -> None:
    published = set(node_labels(profile_inventory(profile, "n0")))
    assert published <= _strings(_variable("gpuweave-node-agent-nodes", "labels"))


def test_the_policy_names_exactly_the_labels_the_agent_may_publish_and_cleanup_removes() -> None:
    assert _strings(_variable("gpuweave-node-agent-nodes", "labels")) == AGENT_LABEL_KEYS


@pytest.mark.parametrize("profile", builtin_profile_names())
def test_every_label_the_agent_publishes_is_one_cleanup_removes(profile: str) -> None:
    assert set(node_labels(profile_inventory(profile, "n0"))) <= AGENT_LABEL_KEYS


def test_the_policy_names_exactly_the_agents_annotation_taints_and_conditions() -> None:
    assert _strings(_variable("gpuweave-node-agent-nodes", "annotations")) == {CORDON_ANNOTATION}
    taints = _strings(_variable("gpuweave-node-agent-nodes", "taints"))
    assert taints == {TAINT_NODE_FAULT, TAINT_HEALTH_PENDING}
    conditions = _strings(_variable("gpuweave-node-agent-nodes", "conditions"))
    assert conditions == set(AGENT_CONDITIONS)


def test_the_eviction_policies_read_the_agents_label_and_the_gang_markers_the_agent_reads() -> None:
    policies = _policies()
    assert EVICTION_LABEL in str(policies["gpuweave-node-agent-evictions"]["spec"]["validations"])
    targets = policies["gpuweave-node-agent-eviction-targets"]["spec"]
    assert targets["matchConstraints"]["objectSelector"] == {"matchLabels": {EVICTION_LABEL: "true"}}
    assert targets["paramKind"] == {"apiVersion": "v1", "kind": "Pod"}
    gang = _strings(_variable("gpuweave-node-agent-eviction-targets", "goesWithItsGang"))
    markers = {ANNOTATION_GANG, LABEL_POD_GROUP, LABEL_JOBSET_NAME, LABEL_REPLICATED_JOB}
    assert markers | {LABEL_KUEUE_POD_GROUP, ANNOTATION_GANG_EVICTION} <= gang
    assert ANNOTATION_OPT_OUT_EVICTION in str(targets["validations"])


def test_every_policy_matches_only_the_agents_identity_with_a_node_in_its_token() -> None:
    for name, policy in _policies().items():
        (condition,) = policy["spec"]["matchConditions"]
        assert f"'{AGENT}'" in condition["expression"], name
        assert "'authentication.kubernetes.io/node-name' in request.userInfo.extra" in condition["expression"]
        assert policy["spec"]["failurePolicy"] == "Fail"
