"""``devicemodel.text``: what a pod wrote leaves a process escaped, visible and clipped."""

from __future__ import annotations

import logging
import sys
import unicodedata

import pytest

from devicemodel.errors import MAX_REASON_CHARS, clip
from devicemodel.text import ESCAPED_CATEGORIES, EscapingFormatter, clip_text, escape_controls, safe_text

HOSTILE = "gang-\x1b[2J\x1b]0;owned\x07\u202etxt.exe\u2066\u200f\u061c\x7f\x85\r\n\tend\ud800\U000e0001\u2028"


def raw_controls(text: str) -> list[str]:
    """The characters of ``text`` a terminal or log reader would act on instead of showing."""
    return [c for c in text if unicodedata.category(c) in ESCAPED_CATEGORIES]


def test_every_control_and_format_character_is_escaped_visibly() -> None:
    shown = escape_controls(HOSTILE)
    assert raw_controls(shown) == [] and shown.isascii()
    assert shown == (
        "gang-\\x1b[2J\\x1b]0;owned\\x07\\u202etxt.exe\\u2066\\u200f\\u061c\\x7f\\x85\\r\\n\\tend"
        "\\ud800\\U000e0001\\u2028"
    )


@pytest.mark.parametrize("text", ["plain node-a: 4 GPUs", "Größe ✓ 東京 café", "a\\x1b stays as typed", ""])
def test_printable_text_is_left_as_it_is(text: str) -> None:
    assert escape_controls(text) == text
    assert safe_text(text, limit=100) is text  # the common case costs one C-level check


def test_a_long_text_is_clipped_to_the_limit_with_what_was_cut() -> None:
    text = "\x1b[31m" + "x" * 1_000_000
    shown = safe_text(text, limit=512)
    assert len(shown) <= 512 and raw_controls(shown) == []
    assert shown.startswith("\\x1b[31mxxx")
    kept = len("\x1b[31m") + len(shown.split("[31m", 1)[1].split("...", 1)[0])
    assert shown.endswith(f"... (cut {len(text) - kept} of {len(text)} characters)")
    assert safe_text(shown, limit=512) == shown  # clipped text passes a second boundary unchanged


def test_a_cut_never_splits_an_escape_and_escapes_count_against_the_limit() -> None:
    text = "\u202e" * 300  # 300 characters, 1,800 once escaped
    shown = safe_text(text, limit=200)
    body = shown.split("...", 1)[0]
    assert len(shown) <= 200 and body == "\\u202e" * (len(body) // 6)
    assert shown.endswith(f"(cut {300 - len(body) // 6} of 300 characters)")


def test_clip_is_the_same_rule_and_json_clipping_escapes_nothing() -> None:
    assert clip(HOSTILE) == safe_text(HOSTILE, limit=MAX_REASON_CHARS)
    assert clip_text("\x1b" * 10, limit=100) == "\x1b" * 10
    cut = clip_text("y" * 10_000, limit=100)
    assert len(cut) <= 100 and cut.endswith("of 10000 characters)")


def test_log_records_are_one_escaped_line_and_tracebacks_stay() -> None:
    formatter = EscapingFormatter("%(levelname)s %(message)s", limit=300)
    arguments = ("ns/p\u202e", HOSTILE * 50)
    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "pod %s: %s", arguments, None)
    line = formatter.format(record)
    assert "\n" not in line and raw_controls(line) == [] and line.startswith("WARNING pod ns/p\\u202e: gang-")
    assert len(line) <= len("WARNING ") + 300
    assert record.getMessage().count("\x1b") == 100  # the record itself is left for other handlers
    try:
        raise ValueError("boom \x1b[2J\u202e")
    except ValueError:
        failed = logging.LogRecord("x", logging.ERROR, __file__, 1, "bad \x1b", (), sys.exc_info())
    text = formatter.format(failed)
    assert text.startswith("ERROR bad \\x1b\nTraceback") and raw_controls(text.replace("\n", "")) == []
    assert text.endswith("ValueError: boom \\x1b[2J\\u202e")  # the traceback's lines kept, escaped
