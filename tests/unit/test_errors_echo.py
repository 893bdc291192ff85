"""devicemodel.errors.echo: a piece of input quoted in a message is cut and says how long it was."""

from __future__ import annotations

from devicemodel.errors import ECHO_CHARS, echo


def test_short_value_is_its_repr() -> None:
    assert echo("spread") == "'spread'"
    assert echo(3) == "3"


def test_long_string_is_cut_and_names_its_length() -> None:
    text = echo("x" * 250 * 1024)
    assert text.endswith(f"... ({250 * 1024} characters)")
    assert len(text) < ECHO_CHARS + 40


def test_long_non_string_is_cut_by_its_repr() -> None:
    value = list(range(10_000))
    text = echo(value, limit=20)
    assert text.startswith(repr(repr(value)[:20]))
    assert text.endswith(f"... ({len(repr(value))} characters)")


def test_value_at_the_limit_is_whole() -> None:
    assert echo("y" * ECHO_CHARS) == repr("y" * ECHO_CHARS)
