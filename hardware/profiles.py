"""Node profiles by name or path: the built-in machines and users' own YAML files.

A built-in profile is just a YAML file packaged in ``hardware/builtin_profiles``; a user's file
goes through exactly the same parser and checks, so what works for one works for the other.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import yaml

from devicemodel.spec import NodeProfile, ProfileError

_BUILTIN_PACKAGE = "hardware.builtin_profiles"
_SUFFIXES = (".yaml", ".yml")


def builtin_profile_names() -> tuple[str, ...]:
    """Names of the packaged profiles (``p5.48xlarge``, ``dgx1-v100``, ...), sorted."""
    root = resources.files(_BUILTIN_PACKAGE)
    names = (entry.name.removesuffix(".yaml") for entry in root.iterdir() if entry.name.endswith(".yaml"))
    return tuple(sorted(names))


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
