"""Fuzzed pods over real HTTP: whatever the selector or quantity, every verb answers 200, and a
request the API server would refuse is never bound.

The API server's rules are stated here as the test's own oracle, by construction: a generated
quantity is either built from Kubernetes' grammar (with its count known) or broken on purpose
(a Unicode digit, a fraction, a sign, an unknown suffix), and free text counts as bindable only
if it matches the grammar as written in ``KUBERNETES_QUANTITY``.
"""

from __future__ import annotations

import http.client
import itertools
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devicemodel.contracts import ANNOTATION_GPU_SELECTOR, RESOURCE_GPU
from gpuweave.simulate.cluster_objects import (
    cluster_list,
    inventory_object,
    node_object,
    pod_object,
    profile_inventory,
)
from scheduler_ext.app import Extender, build_snapshot_extender

NODES = ["h100-a", "h100-b"]
KUBERNETES_QUANTITY = re.compile(
    r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?", re.ASCII
)
FUZZ = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
_uids = itertools.count()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Extender, http.client.HTTPConnection]]:
    items: list[dict[str, Any]] = []
    for name in NODES:
        inventory = profile_inventory("p5.48xlarge", name)
        items += [node_object(name, gpus=len(inventory.gpus)), inventory_object(inventory)]
    path = tmp_path_factory.mktemp("fuzz") / "cluster.json"
    path.write_text(json.dumps(cluster_list(items)))
    built = build_snapshot_extender(path)
    built.serve(host="127.0.0.1", port=0)
    assert built.server is not None
    connection = http.client.HTTPConnection("127.0.0.1", built.server.server_address[1], timeout=30)
    try:
        yield built, connection
    finally:
        connection.close()
        built.close()


def _post(connection: http.client.HTTPConnection, verb: str, body: object) -> tuple[int, Any]:
    connection.request("POST", f"/{verb}", body=json.dumps(body).encode())
    response = connection.getresponse()
    data = response.read()
    return response.status, json.loads(data) if response.status == 200 else data.decode()


def _round(served: tuple[Extender, http.client.HTTPConnection], pod: dict[str, Any]) -> str | None:
    """filter, prioritize, bind and preempt the pod; all must answer 200. The bind's error text,
    or None when it bound (the holding is released again so the cluster stays empty)."""
    built, connection = served
    args = {"Pod": pod, "Nodes": None, "NodeNames": NODES}
    status, result = _post(connection, "filter", args)
    assert status == 200, result
    assert _post(connection, "prioritize", args)[0] == 200
    victims = {"Pod": pod, "NodeNameToMetaVictims": {NODES[0]: {"Pods": [], "NumPDBViolations": 0}}}
    assert _post(connection, "preempt", victims)[0] == 200
    node = (result["NodeNames"] or NODES)[0]
    uid = pod["metadata"]["uid"]
    bind = {"PodName": pod["metadata"]["name"], "PodNamespace": "default", "PodUID": uid, "Node": node}
    status, bound = _post(connection, "bind", bind)
    assert status == 200, bound
    if bound["Error"]:
        assert built.cache.holding(uid) is None
        return str(bound["Error"])
    built.cache.delete_pod(uid)  # as the watch reports the pod's deletion
    return None


def _pod(
    limits: dict[str, object], *, selector: str | None = None, extra: str | None = None
) -> dict[str, Any]:
    name = f"fuzz-{next(_uids)}"
    pod = pod_object(name, annotations={ANNOTATION_GPU_SELECTOR: selector} if selector is not None else None)
    pod["spec"]["containers"] = [{"name": "main", "resources": {"limits": limits, "requests": limits}}]
    if extra is not None:  # a second container: its name may clash with the first
        pod["spec"]["containers"].append({"name": extra, "resources": {}})
    return pod


# ---- quantities ---------------------------------------------------------------------------------
_SUFFIX_SCALE = {"": 1, "k": 1000, "Ki": 1024, "e0": 1, "e1": 10, "E2": 100, "m": None}
valid_counts = st.tuples(
    st.integers(0, 16), st.sampled_from(sorted(_SUFFIX_SCALE)), st.sampled_from(["", "+"])
)
broken = st.one_of(
    st.integers(1, 9).map(lambda n: "٣" * n),
    st.sampled_from(
        ["²", "३", "\uff12", "1.5", "0.5", "-1", "2 GPUs", "0x2", "2Kb", "1e", "e3", "", ".", "1..2"]
    ),
    st.integers(1, 8).map(lambda n: f"{n}.{n}"),
    st.integers(1, 8).map(lambda n: f"{n}m"),  # milli-units that are no whole number
)


@FUZZ
@given(valid=valid_counts)
def test_a_valid_count_binds_exactly_that_many(
    served: tuple[Extender, http.client.HTTPConnection], valid: tuple[int, str, str]
) -> None:
    number, suffix, sign = valid
    scale = _SUFFIX_SCALE[suffix]
    text = f"{sign}{number * 1000 if scale is None else number}{suffix}"
    count = number if scale is None else number * scale
    error = _round(served, _pod({RESOURCE_GPU: text}))
    assert (error is None) == (count <= 8), (text, error)  # a p5.48xlarge node has 8 GPUs


@FUZZ
@given(value=st.one_of(broken, st.text(max_size=8), st.floats(), st.booleans(), st.none()))
def test_a_count_the_api_server_refuses_is_never_bound(
    served: tuple[Extender, http.client.HTTPConnection], value: object
) -> None:
    error = _round(served, _pod({RESOURCE_GPU: value}))
    if error is None:
        assert _api_server_parses(value), value
        assert value not in ("1.5", "0.5", "-1")


def _api_server_parses(value: object) -> bool:
    """Quantity's JSON decoding: a string's content or a bare number's text, trimmed."""
    if isinstance(value, bool) or value is None:
        return False
    text = value.strip() if isinstance(value, str) else json.dumps(value)
    return KUBERNETES_QUANTITY.fullmatch(text) is not None


@FUZZ
@given(
    name=st.sampled_from(
        ["gpuweave.io/gpu-foo", "gpuweave.io/gpu", "gpuweave.io/gpu-memroy", "gpuweave.io/x"]
    ),
    clash=st.booleans(),
)
def test_unknown_gpuweave_names_and_duplicate_containers_are_never_bound(
    served: tuple[Extender, http.client.HTTPConnection], name: str, clash: bool
) -> None:
    limits: dict[str, object] = {RESOURCE_GPU: "1"} if clash else {name: "1"}
    error = _round(served, _pod(limits, extra="main" if clash else None))
    assert error is not None and ("unique" in error if clash else name in error)


# ---- selectors ----------------------------------------------------------------------------------
_ATTRIBUTE = st.sampled_from(
    [
        'device.attributes["gpuweave.io"].architecture',
        'device.attributes["gpuweave.io"].productName',
        'device.attributes["gpuweave.io"].cudaComputeCapability',
        'device.attributes["gpuweave.io"].nvlinkPeers',
        'device.attributes["resource.kubernetes.io"].numaNode',
        'device.capacity["gpuweave.io"].memory',
        "device.attributes.nothing",
    ]
)
_LITERAL = st.one_of(
    st.integers(-(2**63), 2**63 - 1).map(str),
    st.sampled_from(['"hopper"', "0", "1u", "2.5", "true", "null", "[1, 2, 3]", '{"a": 1}', "b'x'"]),
    st.text(max_size=6).map(lambda t: f'quantity("{t}")'),
    st.text(max_size=6).map(lambda t: f'semver("{t}")'),
)


def _combine(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    operators = st.sampled_from([" && ", " || ", " == ", " < ", " + ", " / ", " % ", " * ", " in "])
    return st.one_of(
        st.tuples(children, operators, children).map("".join),
        children.map(lambda c: f"!({c})"),
        children.map(lambda c: f"-{c}"),
        children.map(lambda c: f"[0, 1, 2].all(x, {c})"),
        children.map(lambda c: f"[1, 2].map(y, {c}).exists(z, z == true)"),
        st.tuples(children, children, children).map(lambda t: f"{t[0]} ? {t[1]} : {t[2]}"),
    )


selectors = st.one_of(
    st.recursive(st.one_of(_ATTRIBUTE, _LITERAL), _combine, max_leaves=8),
    st.text(max_size=40),
)


@FUZZ
@given(selector=selectors)
def test_any_selector_gets_an_answer_on_every_verb(
    served: tuple[Extender, http.client.HTTPConnection], selector: str
) -> None:
    _round(served, _pod({RESOURCE_GPU: "1"}, selector=selector))
