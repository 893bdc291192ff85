"""Degraded links read from outside the process: the published ``status.degradedLinks`` (read by the
extender) and ``degraded-links.json`` (read by a restarted agent). Hostile or broken input gets an
error naming the entry and the field, never an exception out of the reader; the extender leaves
the entry out, the agent stops its start without touching the file. What the writers write always
reads back, in the format the earlier writers wrote."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from devicemodel.degraded import MAX_LINKS, MAX_REASON, links_from_wire, links_to_wire
from devicemodel.inventory import DegradedLink
from gpuweave.simulate.cluster_objects import profile_inventory
from health.errors import HealthStateError
from health.links import LinkRecord
from health.links_file import DEGRADED_LINKS_FILE, MAX_RECORDS, DegradedLinkFile
from nodeagent.published import inventory_object
from scheduler_ext.cluster.objects import inventory_record

GOOD = {"gpus": [0, 1], "fraction": 0.5}

# ---- the published field ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ("0-1", "degradedLinks[0]: Input should be a valid dictionary"),
        ([0, 1, 0.5], "degradedLinks[0]: Input should be a valid dictionary"),
        ({**GOOD, "gpus": "01"}, "degradedLinks[0].gpus: Input should be a valid list"),
        ({**GOOD, "gpus": (0, 1)}, "degradedLinks[0].gpus: Input should be a valid list"),
        ({**GOOD, "gpus": [0, "1"]}, "degradedLinks[0].gpus.1: Input should be a valid integer"),
        ({**GOOD, "gpus": [0, 1.0]}, "degradedLinks[0].gpus.1: Input should be a valid integer"),
        ({**GOOD, "gpus": [True, 1]}, "degradedLinks[0].gpus.0: Input should be a valid integer"),
        ({**GOOD, "gpus": [0]}, "degradedLinks[0].gpus: List should have at least 2 items"),
        ({**GOOD, "gpus": [0, 1, 2]}, "degradedLinks[0].gpus: List should have at most 2 items"),
        ({**GOOD, "gpus": [3, 3]}, "degradedLinks[0].gpus: Value error, names one GPU twice"),
        ({**GOOD, "gpus": [-1, 1]}, "degradedLinks[0].gpus.0: Input should be greater than or equal to 0"),
        ({**GOOD, "gpus": [0, 256]}, "degradedLinks[0].gpus.1: Input should be less than 256"),
        ({**GOOD, "gpus": [0, 10**30]}, "degradedLinks[0].gpus.1: Input should be less than 256"),
        ({"gpus": [0, 1]}, "degradedLinks[0].fraction: Field required"),
        ({**GOOD, "fraction": "0.5"}, "degradedLinks[0].fraction: Input should be a valid number"),
        ({**GOOD, "fraction": True}, "degradedLinks[0].fraction: Input should be a valid number"),
        ({**GOOD, "fraction": None}, "degradedLinks[0].fraction: Input should be a valid number"),
        ({**GOOD, "fraction": float("nan")}, "degradedLinks[0].fraction: Input should be a finite number"),
        ({**GOOD, "fraction": float("inf")}, "degradedLinks[0].fraction: Input should be a finite number"),
        ({**GOOD, "fraction": 1e308}, "degradedLinks[0].fraction: Input should be less than or equal to 1"),
        ({**GOOD, "fraction": 10**400}, "degradedLinks[0].fraction: Input should be a valid number"),
        ({**GOOD, "fraction": -0.1}, "degradedLinks[0].fraction: Input should be greater than or equal to 0"),
        ({**GOOD, "reason": 5}, "degradedLinks[0].reason: Input should be a valid string"),
        (
            {**GOOD, "reason": "x" * 1025},
            "degradedLinks[0].reason: String should have at most 1024 characters",
        ),
    ],
)
def test_a_bad_published_entry_is_left_out_with_its_field_named(entry: object, problem: str) -> None:
    links, problems = links_from_wire([entry, GOOD])
    assert links == (DegradedLink(0, 1, 0.5),)  # the good entry beside it is still read
    (line,) = problems
    assert line.startswith(problem) and len(line) < 200  # the entry itself is not repeated


def test_the_published_field_past_the_crds_cap_is_not_read_and_at_it_is() -> None:
    many = [{"gpus": [a, b], "fraction": 0.5} for a in range(64) for b in range(a + 1, 64)][: MAX_LINKS + 1]
    assert links_from_wire(many) == (
        (),
        [f"degradedLinks has {MAX_LINKS + 1} entries, more than the 512 the CRD allows"],
    )
    links, problems = links_from_wire(many[:MAX_LINKS])
    assert len(links) == MAX_LINKS and problems == []
    assert links_from_wire({"gpus": [0, 1]}) == ((), ["degradedLinks is not a list"])


def test_published_fields_the_reader_does_not_know_and_a_null_reason_are_read() -> None:
    newer = {**GOOD, "measuredAt": "2026-12-05T16:00:00Z", "reason": None}
    assert links_from_wire([newer]) == ((DegradedLink(0, 1, 0.5),), [])
    assert links_from_wire([{**GOOD, "fraction": 1}])[0][0].fraction == 1.0  # an integer is a number


def test_an_inventory_with_hostile_degraded_links_parses_without_them() -> None:
    inventory = profile_inventory("p5.48xlarge", "n1")
    obj = inventory_object(inventory, degraded=[DegradedLink(0, 1, 0.5)])
    for hostile in ("x" * 10**6, [[0, 1]] * 513, [{"gpus": [0, 0], "fraction": float("nan")}] * 512):
        odd = {**obj, "status": {**obj["status"], "degradedLinks": hostile}}
        assert inventory_record(odd).inventory.degraded_links == ()


def test_the_writer_writes_what_the_reader_reads_with_long_reasons_and_too_many_links() -> None:
    long = DegradedLink(1, 0, 0.25, "slow " + "\n" * 2000)  # a reason that is not one line, and long
    (entry,) = links_to_wire([long])
    assert len(entry["reason"]) <= MAX_REASON and "\n" not in entry["reason"]
    assert links_from_wire([entry]) == ((DegradedLink(0, 1, 0.25),), [])
    pairs = [(a, b) for a in range(40) for b in range(a + 1, 40)]  # 780 pairs
    links = [DegradedLink(a, b, round(0.001 * (i % 900), 3)) for i, (a, b) in enumerate(pairs)]
    wire = links_to_wire(links)
    assert len(wire) == MAX_LINKS and wire == sorted(wire, key=lambda e: e["gpus"])
    assert max(e["fraction"] for e in wire) <= sorted(link.fraction for link in links)[MAX_LINKS - 1]
    read, problems = links_from_wire(wire)
    assert len(read) == MAX_LINKS and problems == []


# ---- degraded-links.json -----------------------------------------------------------------------

RECORD = {"gpus": ["GPU-a", "GPU-b"], "fraction": 0.425, "reason": "active-check: NVLink copies"}


def _file(tmp_path: Path, contents: bytes | str) -> Path:
    path = tmp_path / DEGRADED_LINKS_FILE
    path.write_bytes(contents if isinstance(contents, bytes) else contents.encode())
    return path


def test_a_file_the_earlier_agent_wrote_reads_and_saves_to_the_same_bytes(tmp_path: Path) -> None:
    other = {"gpus": ["GPU-c", "GPU-d"], "fraction": 1, "reason": ""}
    earlier = json.dumps([RECORD, other], indent=1, sort_keys=True).encode()  # as the earlier save wrote
    path = _file(tmp_path, earlier)
    links = DegradedLinkFile(tmp_path).load()
    assert links == {
        frozenset(("GPU-a", "GPU-b")): LinkRecord(("GPU-a", "GPU-b"), 0.425, RECORD["reason"]),  # type: ignore[arg-type]
        frozenset(("GPU-c", "GPU-d")): LinkRecord(("GPU-c", "GPU-d"), 1.0, ""),
    }
    DegradedLinkFile(tmp_path).save(links)
    assert path.read_bytes() == earlier.replace(b'"fraction": 1,', b'"fraction": 1.0,')
    _file(tmp_path, json.dumps([{"gpus": ["GPU-b", "GPU-a"], "fraction": 0.5}]))  # no reason, unsorted
    assert DegradedLinkFile(tmp_path).load() == {
        frozenset(("GPU-a", "GPU-b")): LinkRecord(("GPU-a", "GPU-b"), 0.5, "")
    }
    _file(tmp_path, "null")
    assert DegradedLinkFile(tmp_path).load() == {}


@pytest.mark.parametrize(
    ("contents", "problem"),
    [
        (b"\xff\xfe[]", "cannot read health state file"),  # not UTF-8
        ('[{"gpus": ["GPU-a", "GPU-b"]', "cannot read health state file"),  # cut short
        ("[" + "9" * 5000 + "]", "cannot read health state file"),  # a number past Python's digit limit
        ("{}", "is not a list of at most 4096 degraded-link records: Input should be a valid list"),
        ('"GPU-a GPU-b"', "is not a list of at most 4096 degraded-link records"),
        (
            "[1]",
            r"has an entry that is not a degraded-link record: \[0\]: Input should be a valid dictionary",
        ),
        ('[{"gpus": ["GPU-a"], "fraction": 0.5}]', r"\[0\].gpus: List should have at least 2 items"),
        ('[{"gpus": ["GPU-a", 5], "fraction": 0.5}]', r"\[0\].gpus.1: Input should be a valid string"),
        (
            '[{"gpus": ["GPU-a", ""], "fraction": 0.5}]',
            r"\[0\].gpus.1: String should have at least 1 character",
        ),
        ('[{"gpus": ["GPU-a", "GPU-a"], "fraction": 0.5}]', r"\[0\].gpus: Value error, names one GPU twice"),
        (
            json.dumps([{**RECORD, "gpus": ["GPU-a", "G" * 257]}]),
            r"\[0\].gpus.1: String should have at most 256",
        ),
        ('[{"gpus": ["GPU-a", "GPU-b"]}]', r"\[0\].fraction: Field required"),
        (
            '[{"gpus": ["GPU-a", "GPU-b"], "fraction": "0.5"}]',
            r"\[0\].fraction: Input should be a valid number",
        ),
        (
            '[{"gpus": ["GPU-a", "GPU-b"], "fraction": true}]',
            r"\[0\].fraction: Input should be a valid number",
        ),
        (
            '[{"gpus": ["GPU-a", "GPU-b"], "fraction": NaN}]',
            r"\[0\].fraction: Input should be a finite number",
        ),
        ('[{"gpus": ["GPU-a", "GPU-b"], "fraction": Infinity}]', r"\[0\].fraction: Input should be a finite"),
        ('[{"gpus": ["GPU-a", "GPU-b"], "fraction": 1e999}]', r"\[0\].fraction: Input should be a finite"),
        (
            '[{"gpus": ["GPU-a", "GPU-b"], "fraction": 1e300}]',
            r"\[0\].fraction: Input should be less than or",
        ),
        ('[{"gpus": ["GPU-a", "GPU-b"], "fraction": -0.5}]', r"\[0\].fraction: Input should be greater than"),
        (json.dumps([RECORD, {**RECORD, "reason": 7}]), r"\[1\].reason: Input should be a valid string"),
        (json.dumps([{**RECORD, "reason": "x" * 1025}]), r"\[0\].reason: String should have at most 1024"),
        (json.dumps([{**RECORD, "since": "2026-12-05"}]), r"\[0\].since: Extra inputs are not permitted"),
        (
            json.dumps([RECORD] * 4097),
            "is not a list of at most 4096 degraded-link records: List should have at most",
        ),
    ],
)
def test_a_broken_file_stops_the_start_naming_the_field_and_is_left_as_it_was(
    tmp_path: Path, contents: bytes | str, problem: str
) -> None:
    path = _file(tmp_path, contents)
    before = path.read_bytes()
    with pytest.raises(HealthStateError, match=problem) as caught:
        DegradedLinkFile(tmp_path).load()
    message = str(caught.value)
    assert str(path) in message and message.endswith("fix or delete it") and "\n" not in message
    assert len(message) < 1000  # the file's contents are not repeated into the error
    assert path.read_bytes() == before


def test_what_save_writes_always_loads_even_past_the_bounds(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    uuids = [f"GPU-{i:04d}" for i in range(100)]
    pairs = [(a, b) for i, a in enumerate(uuids) for b in uuids[i + 1 :]][: MAX_RECORDS + 10]
    records = {
        frozenset(p): LinkRecord(p, round(0.0001 * (n % 9000), 4), "slow\n" * 300)
        for n, p in enumerate(pairs)
    }
    DegradedLinkFile(tmp_path).save(records)
    loaded = DegradedLinkFile(tmp_path).load()
    assert len(loaded) == MAX_RECORDS and "saving the slowest" in caplog.text
    kept = sorted(r.fraction for r in records.values())[:MAX_RECORDS]
    assert sorted(r.fraction for r in loaded.values()) == kept
    assert all(len(r.reason) <= MAX_REASON and "\n" not in r.reason for r in loaded.values())
