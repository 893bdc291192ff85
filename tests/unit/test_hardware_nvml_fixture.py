"""The NVML recording format: forms of machine-dependent values, the comparison, the file round trip."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from hardware.backend import HardwareTimeoutError, NotSupportedError
from hardware.nvml_fixture import (
    Entry,
    FixtureError,
    compare,
    dump,
    encode_answer,
    encode_error,
    fixture_name,
    form,
    load,
)
from hardware.simulated.structs import NvmlConstants


class _Placement(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("GPU-8a7c0c3e-0000-4000-8000-000000000000", "GPU-h-h-h-h-h"),
        ("00000000:1B:00.0", "h:h:h.h"),
        ("550.90.07", "h.h.h"),
        (41, "number"),
        (True, "bool"),
        ([1, 2], "list"),
        ({"busId": "00000000:1B:00.0"}, {"busId": "h:h:h.h"}),
    ],
)
def test_form_keeps_the_shape_and_drops_the_machine(value: object, expected: object) -> None:
    assert form(value) == expected


def test_answers_keep_the_fields_the_product_reads() -> None:
    class Info:
        id, placement, device = 3, _Placement(4, 4), "parent"

    assert encode_answer(Info(), fields=("id", "placement", "device")) == {
        "ok": {"id": 3, "placement": {"start": 4, "size": 4}, "device": "parent"}
    }
    assert encode_answer(b"NVIDIA H100 80GB HBM3") == {"ok": "NVIDIA H100 80GB HBM3"}
    assert encode_answer(ctypes.c_uint(7)) == {"ok": 7}


def test_errors_are_recorded_by_their_nvml_name() -> None:
    error = NotSupportedError("no", call="nvmlDeviceGetGpuFabricInfoV", code=3)
    assert encode_error(error, NvmlConstants) == {"error": "NVML_ERROR_NOT_SUPPORTED"}
    assert encode_error(HardwareTimeoutError("hung", call="x"), NvmlConstants) == {"error": "timeout"}


def test_compare_checks_values_of_the_product_and_forms_of_the_machine() -> None:
    recorded = [
        Entry("nvmlDeviceGetUUID", ("gpu0",), {"ok": "GPU-8a7c0c3e-0000-4000-8000-000000000000"}),
        Entry("nvmlDeviceGetPciInfo", ("gpu0",), {"ok": {"busId": "00000000:1B:00.0"}}),
        Entry("nvmlDeviceGetMemoryInfo", ("gpu0",), {"ok": {"total": 85520809984}}),
        Entry("nvmlDeviceGetNvLinkState", ("gpu0", 18), {"error": "NVML_ERROR_INVALID_ARGUMENT"}),
    ]
    same_product = [
        Entry("nvmlDeviceGetUUID", ("gpu0",), {"ok": "GPU-00000000-1111-4000-8000-000000000000"}),
        Entry("nvmlDeviceGetPciInfo", ("gpu0",), {"ok": {"busId": "00000000:18:00.0"}}),
        Entry("nvmlDeviceGetMemoryInfo", ("gpu0",), {"ok": {"total": 85520809984}}),
        Entry("nvmlDeviceGetNvLinkState", ("gpu0", 18), {"error": "NVML_ERROR_INVALID_ARGUMENT"}),
    ]
    assert compare(recorded, same_product) == []
    wrong = [
        Entry("nvmlDeviceGetUUID", ("gpu0",), {"ok": "8a7c0c3e"}),
        Entry("nvmlDeviceGetMemoryInfo", ("gpu0",), {"ok": {"total": 81559}}),
        Entry("nvmlDeviceGetNvLinkState", ("gpu0", 18), {"ok": 1}),
        Entry("nvmlDeviceGetNvLinkState", ("gpu0", 19), {"error": "NVML_ERROR_INVALID_ARGUMENT"}),
    ]
    problems = compare(recorded, wrong)
    assert [p.split(":")[0] for p in problems] == [
        "nvmlDeviceGetUUID(gpu0)",
        "nvmlDeviceGetPciInfo(gpu0)",
        "nvmlDeviceGetMemoryInfo(gpu0)",
        "nvmlDeviceGetNvLinkState(gpu0, 18)",
        "nvmlDeviceGetNvLinkState(gpu0, 19)",
    ]
    assert "never asked" in problems[1] and "not recorded" in problems[4]


def test_a_fixture_round_trips_and_a_bad_one_names_itself(tmp_path: Path) -> None:
    entries = [
        Entry("nvmlDeviceGetCount", (), {"ok": 8}),
        Entry("nvmlDeviceGetName", ("gpu0",), {"ok": "NVIDIA L40S"}),
    ]
    path = tmp_path / fixture_name("NVIDIA H100 80GB HBM3", "550.90.07")
    assert path.name == "nvidia-h100-80gb-hbm3-550.90.07.json"
    path.write_text(dump({"profile": "dgx-h100"}, entries))
    meta, loaded = load(path)
    assert meta == {"format": 1, "profile": "dgx-h100"} and loaded == entries
    path.write_text('{"format": 0, "entries": []}')
    with pytest.raises(FixtureError, match=r"format 0, expected 1"):
        load(path)
    path.write_text("[")
    with pytest.raises(FixtureError, match=r"not an NVML recording .*scripts/gpu-check"):
        load(path)
