"""The simulated fabric-info struct is pynvml's: same fields in the same order, same version word."""

from __future__ import annotations

import ctypes

import pynvml

from hardware.simulated.structs import c_nvmlGpuFabricInfoV_t


def test_fabric_info_struct_matches_pynvml() -> None:
    real, fake = pynvml.c_nvmlGpuFabricInfoV_t, c_nvmlGpuFabricInfoV_t
    assert [name for name, _ in fake._fields_] == [name for name, _ in real._fields_]
    assert ctypes.sizeof(fake) == ctypes.sizeof(real)
    assert fake().version == real().version
