from __future__ import annotations

import re

import pytest

from devicemodel.contracts import mig_profile_of_resource, mig_resource_name

# An extended resource name's part after the domain: a qualified name (alphanumerics, -, _, .).
RESOURCE_NAME = re.compile(r"^[a-z0-9.-]+/[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")


@pytest.mark.parametrize(
    ("profile", "resource"),
    [
        ("3g.40gb", "nvidia.com/mig-3g.40gb"),
        ("1g.10gb+me", "nvidia.com/mig-1g.10gb.me"),
        ("1g.12gb+me.all", "nvidia.com/mig-1g.12gb.me.all"),
        ("1g.24gb+gfx", "nvidia.com/mig-1g.24gb.gfx"),
    ],
)
def test_mig_resource_names_are_valid_and_round_trip(profile: str, resource: str) -> None:
    assert mig_resource_name(profile) == resource
    assert RESOURCE_NAME.match(resource)
    assert mig_profile_of_resource(resource) == profile


def test_other_resources_are_not_mig() -> None:
    assert mig_profile_of_resource("nvidia.com/gpu") is None
    assert mig_profile_of_resource("gpuweave.io/gpu-compute") is None
