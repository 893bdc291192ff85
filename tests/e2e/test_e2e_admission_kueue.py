"""What the extender's identity may write to Kueue's objects, enforced by the real kube-apiserver:
the ValidatingAdmissionPolicies of manifests/admission-kueue-check.yaml (in the kustomize base the
session's control plane was given) let it write its own admission check's entry of a Workload's
status and the status of its own AdmissionChecks, and refuse every other status write RBAC alone
would let through. No Kueue manager runs here: the objects' status is what the test writes."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from scheduler_ext.kueue.checks import CONTROLLER_NAME
from scheduler_ext.kueue.controller import FIELD_MANAGER
from tests.e2e.cluster import ControlPlane, queueing_crds
from tests.support.api_outcome import outcome as _outcome
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e

SPACE = "e2e-kueue-admission"
GROUP, VERSION = "kueue.x-k8s.io", "v1beta2"
OURS, THEIRS = "gpuweave-gpu-health", "e2e-other-check"  # the name the base lists, another check
WORKLOAD = "e2e-guarded"
APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"
NOW = "2026-01-01T00:00:00Z"


def _entry(name: str, state: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "state": state, "message": "", "lastTransitionTime": NOW, **extra}


def _workload_status(plane: ControlPlane) -> dict[str, Any]:
    custom = client.CustomObjectsApi(plane.api)
    found: dict[str, Any] = custom.get_namespaced_custom_object(GROUP, VERSION, SPACE, "workloads", WORKLOAD)
    return found.get("status", {})


@pytest.fixture(scope="module")
def extender(plane: ControlPlane, scheduler_kubeconfig: Path) -> Iterator[client.CustomObjectsApi]:
    """Kueue's CRDs; a Workload whose status names our check and another one; two AdmissionChecks
    (ours and another controller's); and the extender's identity (the gpuweave-scheduler service
    account, with the kustomize base's RBAC) once the policy is in force."""
    plane.apply(queueing_crds())
    plane.ensure_namespace(SPACE)
    admin = client.CustomObjectsApi(plane.api)
    checks = [  # applied, not created: the Kueue tests leave an AdmissionCheck of this name behind
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "AdmissionCheck",
            "metadata": {"name": name},
            "spec": {"controllerName": controller},
        }
        for name, controller in ((OURS, CONTROLLER_NAME), (THEIRS, "example.com/other"))
    ]
    plane.apply(checks)
    workload = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Workload",
        "metadata": {"name": WORKLOAD},
        "spec": {
            "queueName": "e2e-queue",
            "podSets": [
                {
                    "name": "main",
                    "count": 1,
                    "template": {"spec": {"containers": [{"name": "c", "image": "x"}]}},
                }
            ],
        },
    }
    admin.create_namespaced_custom_object(GROUP, VERSION, SPACE, "workloads", workload)
    status = {"admissionChecks": [_entry(OURS, "Pending"), _entry(THEIRS, "Pending")]}
    admin.patch_namespaced_custom_object_status(
        GROUP, VERSION, SPACE, "workloads", WORKLOAD, {"status": status}, _content_type=MERGE
    )
    api = config.new_client_from_config(config_file=str(scheduler_kubeconfig))
    custom = client.CustomObjectsApi(api)
    forged = partial(
        _patch_status, custom, {"admissionChecks": [_entry(OURS, "Pending"), _entry(THEIRS, "Ready")]}
    )
    wait_until(  # the API server loads a new policy through an informer, a moment after it exists
        "the Kueue admission policy in force",
        lambda: "cannot change another check's entry" in _outcome(forged),
    )
    try:
        yield custom
    finally:
        api.close()
        for name in (OURS, THEIRS):
            admin.delete_cluster_custom_object(GROUP, VERSION, "admissionchecks", name)
        admin.delete_namespaced_custom_object(GROUP, VERSION, SPACE, "workloads", WORKLOAD)


def _apply_status(custom: client.CustomObjectsApi, status: dict[str, Any]) -> None:
    """The extender's own write: server-side apply of the given status fields, as its controller does."""
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Workload",
        "metadata": {"name": WORKLOAD, "namespace": SPACE},
        "status": status,
    }
    custom.patch_namespaced_custom_object_status(
        GROUP,
        VERSION,
        SPACE,
        "workloads",
        WORKLOAD,
        body,
        field_manager=FIELD_MANAGER,
        force=True,
        _content_type=APPLY,
    )


def _patch_status(custom: client.CustomObjectsApi, status: dict[str, Any]) -> None:
    custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, SPACE, "workloads", WORKLOAD, {"status": status}, _content_type=MERGE
    )


def test_the_extender_writes_its_own_checks_entry(
    extender: client.CustomObjectsApi, plane: ControlPlane
) -> None:
    for state in ("Ready", "Retry", "Pending"):
        assert _outcome(partial(_apply_status, extender, {"admissionChecks": [_entry(OURS, state)]})) == "ok"
        states = {c["name"]: c["state"] for c in _workload_status(plane)["admissionChecks"]}
        assert states == {OURS: state, THEIRS: "Pending"}


@pytest.mark.parametrize(
    ("write", "refusal"),
    [
        ("another check's entry", "cannot change another check's entry"),
        ("a new check's entry", "cannot add or remove"),
        ("the Workload's conditions", "cannot change the Workload's admission"),
        ("the Workload's admission", "cannot change the Workload's admission"),
        ("podSetUpdates on its own entry", "sets no podSetUpdates"),
    ],
)
def test_the_extender_cannot_write_the_rest_of_a_workloads_status(
    write: str, refusal: str, extender: client.CustomObjectsApi, plane: ControlPlane
) -> None:
    updates = [{"name": "main", "nodeSelector": {"example.com/pool": "any"}}]
    condition = {
        "type": "QuotaReserved",
        "status": "True",
        "reason": "QuotaReserved",
        "message": "forged",
        "lastTransitionTime": NOW,
    }
    admission = {
        "clusterQueue": "any",
        "podSetAssignments": [{"name": "main", "flavors": {"nvidia.com/gpu": "any"}, "count": 1}],
    }
    writes: dict[str, dict[str, Any]] = {
        "another check's entry": {"admissionChecks": [_entry(THEIRS, "Ready")]},
        "a new check's entry": {"admissionChecks": [_entry("e2e-forged-check", "Ready")]},
        "the Workload's conditions": {"conditions": [condition]},
        "the Workload's admission": {"admission": admission},
        "podSetUpdates on its own entry": {"admissionChecks": [_entry(OURS, "Ready", podSetUpdates=updates)]},
    }
    before = _workload_status(plane)
    # an apply names every field its manager keeps: our entry as it is, unless the write changes it
    [own] = [
        {k: c[k] for k in ("name", "state", "message", "lastTransitionTime")}
        for c in before["admissionChecks"]
        if c["name"] == OURS
    ]
    applied = dict(writes[write])
    entries = applied.get("admissionChecks", [])
    if all(entry["name"] != OURS for entry in entries):
        applied["admissionChecks"] = [own, *entries]
    refused = _outcome(partial(_apply_status, extender, applied))
    assert refusal in refused, refused
    assert "gpuweave-kueue-workload-status" in refused
    assert _workload_status(plane) == before
    # the same write as a merge patch (RBAC grants patch, of any kind; a list is replaced whole, so
    # it carries every entry) is refused the same way
    patched = dict(writes[write])
    if "admissionChecks" in patched:
        kept = {c["name"]: c for c in before["admissionChecks"]}
        patched["admissionChecks"] = list(
            {**kept, **{c["name"]: c for c in patched["admissionChecks"]}}.values()
        )
    assert refusal in _outcome(partial(_patch_status, extender, patched))
    assert _workload_status(plane) == before


def test_the_extender_writes_only_its_own_admission_checks_status(extender: client.CustomObjectsApi) -> None:
    condition = {
        "type": "Active",
        "status": "True",
        "reason": "Active",
        "message": "e2e",
        "lastTransitionTime": NOW,
    }

    def mark(name: str) -> str:
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "AdmissionCheck", "metadata": {"name": name}}
        body["status"] = {"conditions": [condition]}
        return _outcome(
            partial(
                extender.patch_cluster_custom_object_status,
                GROUP,
                VERSION,
                "admissionchecks",
                name,
                body,
                field_manager=FIELD_MANAGER,
                force=True,
                _content_type=APPLY,
            )
        )

    assert mark(OURS) == "ok"
    refused = mark(THEIRS)
    assert "its own AdmissionChecks only" in refused and "gpuweave-kueue-admissioncheck-status" in refused
