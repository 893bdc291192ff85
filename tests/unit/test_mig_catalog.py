"""The MIG catalog matches the reference tables and looks models up by NVML product name."""

from __future__ import annotations

import pytest

from devicemodel.inventory import Architecture
from hardware.mig_catalog import MigCatalogError, default_catalog

CATALOG = default_catalog()


@pytest.mark.parametrize("model", CATALOG.models, ids=lambda m: m.key)
def test_every_placement_lies_inside_the_gpu_and_is_aligned(model):
    for profile in model.profiles:
        assert profile.max_count >= 1
        assert profile.compute_slices <= model.compute_slices
        for placement in profile.placements:
            assert placement.end <= model.memory_slices
            assert placement.start % placement.size == 0 or placement.size == 1


@pytest.mark.parametrize("model", CATALOG.models, ids=lambda m: m.key)
def test_profile_ids_and_indices_are_unique_per_model(model):
    assert len({p.profile_id for p in model.profiles}) == len(model.profiles)
    assert len({p.profile_index for p in model.profiles}) == len(model.profiles)
    assert len({p.name for p in model.profiles}) == len(model.profiles)


def test_a100_40gb_matches_the_mig_guide_lgipp():
    model = CATALOG.for_product("NVIDIA A100-SXM4-40GB")
    table = {
        p.name: (p.profile_id, p.memory_slices, p.compute_slices, p.max_count, p.starts)
        for p in model.profiles
    }
    assert table == {
        "1g.5gb": (19, 1, 1, 7, (0, 1, 2, 3, 4, 5, 6)),
        "1g.5gb+me": (20, 1, 1, 1, (0, 1, 2, 3, 4, 5, 6)),
        "1g.10gb": (15, 2, 1, 4, (0, 2, 4, 6)),
        "2g.10gb": (14, 2, 2, 3, (0, 2, 4)),
        "3g.20gb": (9, 4, 3, 2, (0, 4)),
        "4g.20gb": (5, 4, 4, 1, (0,)),
        "7g.40gb": (0, 8, 7, 1, (0,)),
    }
    assert model.profile("1g.5gb").memory_mib == 4864
    assert model.profile("7g.40gb").profile_index == 0x4
    assert model.profile("1g.10gb").profile_index == 0x9


def test_a30_has_four_slots_and_its_own_ids():
    model = CATALOG.for_product("NVIDIA A30")
    assert (model.memory_slices, model.compute_slices) == (4, 4)
    assert model.profile("1g.6gb").profile_id == 14
    assert model.profile("2g.12gb+me").profile_id == 6
    assert model.profile("4g.24gb").starts == (0,)


@pytest.mark.parametrize(
    ("product", "key"),
    [
        ("NVIDIA A100-SXM4-40GB", "A100-SXM4-40GB"),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA A100 80GB PCIe", "A100-80GB"),
        ("NVIDIA A30", "A30-24GB"),
        ("NVIDIA H100 80GB HBM3", "H100-80GB"),
        ("NVIDIA H100 PCIe", "H100-80GB"),
        ("nvidia h100 nvl", "H100-94GB-NVL"),
        ("NVIDIA H200", "H200-141GB"),
        ("NVIDIA B200", "B200-180GB"),
    ],
)
def test_lookup_by_product_name(product, key):
    assert CATALOG.for_product(product).key == key


def test_unknown_product_says_what_is_known():
    with pytest.raises(MigCatalogError, match=r"Tesla V100-SXM2-32GB.*not in the MIG catalog.*A100"):
        CATALOG.for_product("Tesla V100-SXM2-32GB")
    assert not CATALOG.supports("NVIDIA L40S")


def test_unknown_profile_lists_the_offered_ones():
    with pytest.raises(MigCatalogError, match=r"5g.50gb is not offered by H100-80GB; offered: 1g.10gb"):
        CATALOG.model("H100-80GB").profile("5g.50gb")


def test_mode_change_reset_rule_per_generation():
    assert CATALOG.model("A100-80GB").resets_for_mode_change
    assert not CATALOG.model("H100-80GB").resets_for_mode_change
    assert CATALOG.model("B200-180GB").architecture == Architecture.BLACKWELL
