"""Node profiles by name or path: the built-in machines and users' own YAML files.

A built-in profile is just a YAML file packaged in ``hardware/builtin_profiles``; a user's file
goes through exactly the same parser and checks, so what works for one works for the other.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import yaml

from devicemodel.spec import NodeProfile, ProfileError
from devicemodel.spec_rack import RACK_KIND, RackProfile

_BUILTIN_PACKAGE = "hardware.builtin_profiles"
_BUILTIN_RACKS = "hardware.builtin_racks"
_SUFFIXES = (".yaml", ".yml")


def builtin_profile_names() -> tuple[str, ...]:
    """Names of the packaged node profiles (``p5.48xlarge``, ``dgx1-v100``, ...), sorted."""
    return _names(_BUILTIN_PACKAGE)


def builtin_rack_names() -> tuple[str, ...]:
    """Names of the packaged rack profiles (``gb200-nvl72``, ...), sorted."""
    return _names(_BUILTIN_RACKS)


def _names(package: str) -> tuple[str, ...]:
    root = resources.files(package)
    names = (entry.name.removesuffix(".yaml") for entry in root.iterdir() if entry.name.endswith(".yaml"))
    return tuple(sorted(names))


def is_rack(name_or_path: str | Path) -> bool:
    """Whether the name is a built-in rack, or the file a ``RackProfile`` document."""
    text = str(name_or_path)
    if not (isinstance(name_or_path, Path) or _looks_like_path(text)):
        return text in builtin_rack_names()
    try:
        data = yaml.safe_load(Path(text).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return False  # load_profile reports what is wrong with it
    return isinstance(data, dict) and data.get("kind") == RACK_KIND


def load_rack(name_or_path: str | Path) -> tuple[RackProfile, NodeProfile]:
    """A rack profile (built-in name or path) and its node profile; ``ProfileError`` if bad."""
    text = str(name_or_path)
    if isinstance(name_or_path, Path) or _looks_like_path(text):
        source = text
        try:
            content = Path(text).read_text(encoding="utf-8")
        except OSError as exc:
            raise ProfileError(f"cannot read rack profile {text}: {exc.strerror or exc}") from None
    elif text in builtin_rack_names():
        source = f"built-in rack {text}"
        content = resources.files(_BUILTIN_RACKS).joinpath(f"{text}.yaml").read_text(encoding="utf-8")
    else:
        known = ", ".join(builtin_rack_names())
        raise ProfileError(f"no built-in rack profile {text!r} (built-in: {known}); or pass a YAML file path")
    try:
        data = yaml.safe_load(content)
    except yaml.YAMLError:
        raise ProfileError(f"{source}: not valid YAML") from None
    rack = RackProfile.parse(data, source=source)
    return rack, load_profile(rack.spec.node)


def load_profile(name_or_path: str | Path) -> NodeProfile:
    """A built-in profile by name, or a profile file by path; ``ProfileError`` (one line) if bad.

    A string is a path when it names an existing file, contains a path separator or ends in
    ``.yaml``/``.yml``; otherwise it is a built-in profile name.
    """
    text = str(name_or_path)
    if isinstance(name_or_path, Path) or _looks_like_path(text):
        path = Path(text)
        try:
            content = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ProfileError(f"cannot read node profile {path}: {exc.strerror or exc}") from None
        return parse_profile_text(content, source=str(path))
    if text not in builtin_profile_names():
        if text in builtin_rack_names():
            rack, _ = load_rack(text)
            raise ProfileError(
                f"{text} is a rack of {rack.spec.node} nodes, not a node profile; name {rack.spec.node} "
                "for one node (gpuweave simulate --profiles takes racks too)"
            )
        known = ", ".join(builtin_profile_names())
        raise ProfileError(f"no built-in node profile {text!r} (built-in: {known}); or pass a YAML file path")
    content = resources.files(_BUILTIN_PACKAGE).joinpath(f"{text}.yaml").read_text(encoding="utf-8")
    return parse_profile_text(content, source=f"built-in profile {text}")


def parse_profile_text(content: str, *, source: str) -> NodeProfile:
    """Parse one YAML profile document; ``source`` names it in error messages."""
    try:
        data = yaml.safe_load(content)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ProfileError(f"{source}: not valid YAML{where}: {problem}") from None
    if not isinstance(data, dict):
        kind = type(data).__name__ if data is not None else "an empty document"
        raise ProfileError(
            f"{source}: a node profile is a YAML mapping with apiVersion, kind, metadata, spec; got {kind}"
        )
    return NodeProfile.parse(data, source=source)


def _looks_like_path(text: str) -> bool:
    return text.endswith(_SUFFIXES) or "/" in text or Path(text).is_file()
