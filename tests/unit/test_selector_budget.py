"""gpu-selector budgets: refused at first sight when the estimate is over Kubernetes' limit, killed
at the sandbox's deadline otherwise, and every evaluation error an in-band (cached) verdict."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import psutil
import pytest

from devicemodel.quantity import QuantityError
from scheduler_ext.pods.selector import DeviceAttributes, SelectorCache, SelectorError, quantity, semver
from scheduler_ext.pods.selector_cost import COST_LIMIT, estimate
from scheduler_ext.pods.selector_sandbox import SelectorSandbox
from tests.support.waiting import wait_until

H100 = DeviceAttributes(
    architecture="hopper",
    product_name="NVIDIA H100 80GB HBM3",
    compute_capability="9.0",
    driver_version="535.104.05",
    memory_bytes=80 * 2**30,
    mig_capable=True,
    nvlink_peers=7,
    nvswitch=True,
    numa_node=0,
)
LIST_300 = "[" + ",".join(str(i) for i in range(300)) + "]"
# The finding: 1.8-3.3 KB, three nested .all() over 300 elements: 27 million steps, about 25 s.
THREE_NESTED = f"{LIST_300}.all(a, {LIST_300}.all(b, {LIST_300}.all(c, a + b + c >= 0)))"
TWO_NESTED = f"{LIST_300}.all(a, {LIST_300}.all(b, a + b >= 0))"  # ~90,000 steps: under the limit
ARCH = 'device.attributes["gpuweave.io"].architecture'


@pytest.fixture
def selectors() -> Iterator[SelectorCache]:
    cache = SelectorCache()
    try:
        yield cache
    finally:
        cache.close()


def test_three_nested_alls_over_300_elements_are_refused_before_running(selectors: SelectorCache) -> None:
    with pytest.raises(SelectorError, match="1,000,000") as refused:
        selectors.check(THREE_NESTED)
    assert "estimated cost is 189,180,601" in str(refused.value)
    with pytest.raises(SelectorError, match="estimated cost"):  # the verdict path refuses it too
        selectors.verdict(THREE_NESTED, H100)
    assert selectors.sandbox.started == 0  # nothing ran, not even in a worker


@pytest.mark.parametrize(
    ("expression", "most"),
    [
        (f'{ARCH} == "hopper"', 1_000),
        (f'device.capacity["gpuweave.io"].memory >= quantity("40Gi") && {ARCH} != "volta"', 1_000),
        ('device.attributes["gpuweave.io"].productName in ["A", "B", "C"]', 1_000),
        (TWO_NESTED, COST_LIMIT),
    ],
)
def test_ordinary_selectors_are_estimated_under_the_limit(expression: str, most: int) -> None:
    cost = estimate(expression)
    assert cost is not None and cost.cost <= most


def test_only_loops_run_in_the_sandbox(selectors: SelectorCache) -> None:
    assert selectors.verdict(f'{ARCH} == "hopper"', H100) is True
    assert selectors.sandbox.started == 0
    assert selectors.verdict(f'[1, 2].exists(x, x == 2) && {ARCH} == "hopper"', H100) is True
    assert selectors.sandbox.started == 1


def test_a_selector_past_the_deadline_is_refused_and_remembered() -> None:
    """The estimate is lifted so that the deadline is what stops it: 90,000 steps against 1 ms."""
    selectors = SelectorCache(cost_limit=10**12, sandbox=SelectorSandbox(deadline_s=0.001))
    try:
        with pytest.raises(SelectorError, match="deadline") as refused:
            selectors.verdict(TWO_NESTED, H100)
        assert "1,000,000" in str(refused.value)
        assert selectors.sandbox.busy() == 0 and selectors.sandbox.started == 1  # the worker was killed
        with pytest.raises(SelectorError, match="deadline"):
            selectors.check(TWO_NESTED)  # at once, from the cache
        assert selectors.sandbox.started == 1
        selectors.sandbox.deadline_s = 30.0  # room for the next one on a busy machine
        assert selectors.verdict("[1].all(x, x == 1)", H100) is True  # a fresh worker serves it
        assert selectors.sandbox.started == 2
    finally:
        selectors.close()


def test_a_selector_that_kills_its_worker_is_refused_and_remembered() -> None:
    """A worker that ends mid-evaluation (here killed from outside, as a crash in the CEL library
    would end it) refuses the selector from then on, instead of starting a worker per retry."""
    selectors = SelectorCache(cost_limit=10**12, sandbox=SelectorSandbox(deadline_s=600))
    failures: list[str] = []

    def evaluate() -> None:
        try:
            selectors.verdict(THREE_NESTED, H100)
        except SelectorError as exc:
            failures.append(str(exc))

    thread = threading.Thread(target=evaluate)
    try:
        thread.start()
        wait_until("the selector to run in a worker", lambda: selectors.sandbox.busy() == 1)
        for child in psutil.Process().children():
            if "scheduler_ext.pods.selector_worker" in child.cmdline():
                child.kill()
        thread.join(timeout=60)
        assert failures and "ended without an answer" in failures[0]
        with pytest.raises(SelectorError, match="refused"):
            selectors.check(THREE_NESTED)
    finally:
        selectors.close()
        thread.join(timeout=60)


@pytest.mark.parametrize(
    ("expression", "error"),
    [
        ("1 / 0 == 1", "ZeroDivisionError"),
        ("9223372036854775807 + 1 > 0", "OverflowError"),
        ("[1].all(x, 1 / 0 == x)", "ZeroDivisionError"),  # the same, in the sandbox
        ('quantity("٣") > 0', "not a Kubernetes quantity"),
        ('quantity("²") > 0', "not a Kubernetes quantity"),
        ("[1, 2][5] == 1", "index"),
        ('"a" + 1 == "a1"', "TypeError"),
        ("device.attributes.missing.x == 1", "failed"),
        ("1 + 1", "not bool"),
    ],
)
def test_every_evaluation_error_is_a_cached_verdict(
    selectors: SelectorCache, expression: str, error: str
) -> None:
    verdict = selectors.verdict(expression, H100)
    assert isinstance(verdict, str) and error in verdict
    assert selectors.matches(expression, H100) is False
    assert selectors.stats(expression)[1] == 1  # cached: the failure is not evaluated again


def test_selector_helpers_read_ascii_only() -> None:
    assert semver("²") == 0 and semver("8.6") == 8_006_000
    assert quantity("40Gi") == 40 * 2**30 and quantity("1500m") == 2  # rounded up, as Value() does
    with pytest.raises(QuantityError, match="not a Kubernetes quantity"):
        quantity("٣")
