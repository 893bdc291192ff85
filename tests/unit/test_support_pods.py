"""The tests' one pod builder writes the Pod fields each test varies, and only those."""

from __future__ import annotations

from tests.support.pods import pod_body


def test_a_bare_pod_has_one_container_and_nothing_else_set() -> None:
    assert pod_body("p") == {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "labels": {}, "annotations": {}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }


def test_limits_claims_placement_and_scheduling_fields() -> None:
    taint = {"key": "k", "value": "v", "effect": "NoSchedule"}
    pod = pod_body(
        "p",
        namespace="ml",
        uid="u1",
        scheduler="gpuweave-scheduler",
        limits={"nvidia.com/gpu": 2},
        claims={"gpu": "claim-a"},
        node_selector={"kubernetes.io/hostname": "n1"},
        tolerations=[taint],
        grace_s=1,
    )
    spec = pod["spec"]
    assert pod["metadata"]["namespace"] == "ml" and pod["metadata"]["uid"] == "u1"
    resources = spec["containers"][0]["resources"]
    assert resources == {"limits": {"nvidia.com/gpu": "2"}, "claims": [{"name": "gpu"}]}
    assert spec["resourceClaims"] == [{"name": "gpu", "resourceClaimName": "claim-a"}]
    assert spec["tolerations"] == [{**taint, "operator": "Equal"}]
    assert spec["schedulerName"] == "gpuweave-scheduler" and spec["terminationGracePeriodSeconds"] == 1
    assert spec["nodeSelector"] == {"kubernetes.io/hostname": "n1"} and "nodeName" not in spec


def test_a_bound_pod_names_its_node() -> None:
    assert pod_body("p", node="n1")["spec"]["nodeName"] == "n1"
