"""A pod's parse is kept per UID and used only for an object with the same spec, annotations,
namespace and name."""

from __future__ import annotations

from typing import Any

import pytest

from devicemodel.contracts import ANNOTATION_PLACEMENT, RESOURCE_GPU
from gpuweave.simulate.cluster_objects import pod_object
from scheduler_ext.decide.parsed import ParsedPods, parse_pod
from scheduler_ext.decide.workload import pod_shape
from scheduler_ext.pods.requests import BadPodRequestError


def _pod(gpus: int | str, version: str | None, uid: str = "u1") -> dict[str, Any]:
    pod = pod_object("p", uid=uid, limits={RESOURCE_GPU: gpus, "cpu": "2"})
    pod["metadata"].pop("resourceVersion", None)
    if not uid:
        del pod["metadata"]["uid"]
    if version is not None:
        pod["metadata"]["resourceVersion"] = version
    return pod


def _gpus(pods: ParsedPods, pod: dict[str, Any]) -> int:
    request = pods.of(pod).checked()
    return sum(c.gpus for c in request.containers)


def test_a_pod_is_parsed_once_and_a_changed_pod_again() -> None:
    pods = ParsedPods()
    first = pods.of(_pod(2, "10"))
    assert pods.of(_pod(2, "10")) is first and first.host[0] == 2000 and first.ours
    assert pods.of(_pod(2, "11")) is first  # a status change: the same spec
    assert _gpus(pods, _pod(4, "12")) == 4  # resized
    assert _gpus(pods, _pod(2, "12")) == 2  # and back, under a UID whose version says nothing
    annotated = _pod(2, "13")
    annotated["metadata"]["annotations"][ANNOTATION_PLACEMENT] = "nvlink-required"
    assert pods.of(annotated).checked().placement.value == "nvlink-required"


def test_a_pod_without_uid_is_parsed_every_time() -> None:
    pods = ParsedPods()
    assert pods.of(_pod(2, "1", uid="")) is not pods.of(_pod(2, "1", uid=""))


def test_a_bad_pod_keeps_its_reason() -> None:
    parsed = parse_pod(_pod("1.5", "7"))
    assert parsed.request is None and parsed.ours
    with pytest.raises(BadPodRequestError, match=parsed.error):
        parsed.checked()


def test_the_memo_is_bounded() -> None:
    pods = ParsedPods(size=2)
    oldest = pods.of(_pod(1, "1"))
    pods.of(_pod(1, "1", uid="u2"))
    pods.of(_pod(1, "1", uid="u3"))
    assert pods.of(_pod(1, "1")) is not oldest


def test_the_parse_gives_the_pods_shape_as_pod_shape_does() -> None:
    for limits in (
        {"nvidia.com/gpu": 2, "cpu": "4", "memory": "8Gi"},
        {"gpuweave.io/gpu-compute": 25},
        {"nvidia.com/mig-1g.10gb": 1},
        {"cpu": "1"},
    ):
        pod = pod_object("shaped", limits=limits)
        parsed = parse_pod(pod)
        assert parsed.request is not None
        assert parsed.shape == pod_shape(parsed.request, pod)
    assert parse_pod({"spec": {"containers": "nonsense"}}).shape is None
