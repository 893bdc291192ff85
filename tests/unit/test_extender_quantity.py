"""Pod requests parsed as the API server parses them: quantities, duplicate names, unknown names."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from devicemodel.contracts import RESOURCE_GPU, RESOURCE_GPU_MEMORY
from devicemodel.quantity import QuantityError, parse_quantity, whole_units
from gpuweave.simulate.cluster_objects import pod_object
from scheduler_ext.pods.requests import BadPodRequestError, pod_request


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("2", 2),
        ("+2", 2),
        (" 2 ", 2),
        ("2000m", 2),
        ("1e3", 1000),
        ("1E0", 1),
        ("2.", 2),
        ("1Ki", 1024),
        ("0.5Ki", 512),
        ("3k", 3000),
        ("1500000000n", Fraction(3, 2)),
        (".5", Fraction(1, 2)),
        ("-1", -1),
    ],
)
def test_kubernetes_quantities_parse_exactly(text: str, value: Fraction | int) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize(
    "text",
    [
        "",
        "٣",
        "²",
        "३",
        "\uff12",
        "2 GPUs",
        "1e",
        "0x10",
        "1.2.3",
        "Ki",
        "1KB",
        "1e1.5",
        "1e40",
        "9" * 20,
        "1" * 200,
    ],
)
def test_what_the_api_server_refuses_is_refused(text: str) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text)


@pytest.mark.parametrize("text", ["1.5", "500m", "-1", "1n"])
def test_extended_resources_are_whole_non_negative_numbers(text: str) -> None:
    with pytest.raises(QuantityError):
        whole_units(text)


def _pod(containers: list[dict[str, Any]]) -> dict[str, Any]:
    pod = pod_object("p")
    pod["spec"]["containers"] = containers
    return pod


def _container(
    name: str, limits: dict[str, object], requests: dict[str, object] | None = None
) -> dict[str, Any]:
    return {
        "name": name,
        "resources": {"limits": limits, "requests": limits if requests is None else requests},
    }


@pytest.mark.parametrize("value", ["٣", "²", "3.0e0.5", True, None, [3], 2**70, -1, float("nan"), "1.5"])
def test_a_gpu_count_the_api_server_would_refuse_is_a_bad_request(value: object) -> None:
    """The finding: ``"٣"`` bound 3 GPUs and ``"²"`` answered 500."""
    with pytest.raises(BadPodRequestError, match="whole number"):
        pod_request(_pod([_container("main", {RESOURCE_GPU: value})]))


@pytest.mark.parametrize(
    ("value", "count"), [("3", 3), (3, 3), (3.0, 3), ("3000m", 3), ("3e0", 3), ("+3", 3)]
)
def test_gpu_counts_in_every_spelling_the_api_server_accepts(value: object, count: int) -> None:
    request = pod_request(_pod([_container("main", {RESOURCE_GPU: value})]))
    assert request.containers[0].gpus == count


def test_duplicate_container_names_are_refused() -> None:
    """The finding: two containers named alike held 2 GPUs for 6 asked."""
    pod = _pod([_container("worker", {RESOURCE_GPU: "2"}), _container("worker", {RESOURCE_GPU: "4"})])
    with pytest.raises(BadPodRequestError, match="two containers named 'worker'"):
        pod_request(pod)
    pod["spec"]["initContainers"] = [_container("setup", {})]
    pod["spec"]["containers"][1]["name"] = "setup"  # an init container's name counts too
    with pytest.raises(BadPodRequestError, match="'setup'"):
        pod_request(pod)


def test_unknown_gpuweave_resource_is_refused_with_the_known_names() -> None:
    """The finding: ``gpuweave.io/gpu-memroy`` bound with no devices and no word."""
    with pytest.raises(BadPodRequestError, match=r"gpuweave\.io/gpu-memroy") as refused:
        pod_request(_pod([_container("main", {"gpuweave.io/gpu-memroy": "8"})]))
    assert RESOURCE_GPU_MEMORY in str(refused.value)


def test_a_request_must_equal_its_limit() -> None:
    pod = _pod([_container("main", {RESOURCE_GPU: "2"}, requests={RESOURCE_GPU: "1"})])
    with pytest.raises(BadPodRequestError, match="differs from its limit"):
        pod_request(pod)
    equal = _pod([_container("main", {RESOURCE_GPU: "2"}, requests={RESOURCE_GPU: "2000m"})])
    assert pod_request(equal).containers[0].gpus == 2


@pytest.mark.parametrize(
    "text",
    [
        *("0", "7", " 8 ", "007", "8\u00a0"),
        *("999999999999999999", "1000000000000000000", "9223372036854775807", "9223372036854775808"),
        "٣",
    ],
)
def test_bare_counts_take_the_short_path_to_the_same_answer(text: str) -> None:
    """Plain ASCII digits (up to 18 of them) skip the exact-fraction parse; the answer, or the
    refusal, is what the full grammar gives (19 digits and Unicode digits go the long way)."""
    stripped = text.strip()
    number = stripped if stripped.isascii() and stripped.isdigit() else None
    if number is None or int(number) > 2**63 - 1:  # not a quantity, or more than Kubernetes stores
        with pytest.raises(QuantityError):
            whole_units(text)
        return
    assert parse_quantity(text) == Fraction(int(number))
    assert whole_units(text) == int(number)
    assert type(whole_units(text)) is int
