"""Kubernetes quantities, parsed as the API server parses them.

A pod reaches the extender only after the API server accepted it, so a quantity it would refuse
must never mean a number here: ``str.isdigit`` and ``float`` accept Unicode digits (``"٣"``,
``"²"``), exponents beyond any stored value and spellings Kubernetes does not know. This parser
follows the grammar of ``k8s.io/apimachinery/pkg/api/resource`` (ASCII digits, an optional sign,
one binary-SI, decimal-SI or ``e``/``E`` exponent suffix) and answers an exact ``Fraction``.
"""

from __future__ import annotations

import re
from fractions import Fraction

from devicemodel.errors import InvalidInputError

MAX_QUANTITY_CHARS = 128  # far past any real quantity; bounds the work a hostile one can cause
MAX_STORED = 2**63 - 1  # Kubernetes keeps quantities in an int64 (with a scale)
MAX_EXPONENT = 30  # 10^30 is past MAX_STORED in every unit; larger exponents are refused as such

_QUANTITY = re.compile(
    r"(?P<sign>[+-]?)(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:(?P<binary>[KMGTPE]i)|(?P<exponent>[eE][+-]?[0-9]+)|(?P<decimal>[numkMGTPE]))?",
    re.ASCII,
)
_PLAIN = re.compile(r"[0-9]{1,18}", re.ASCII)  # a bare count below 10^18 (< 2^63-1): most quantities
_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


class QuantityError(InvalidInputError):
    """A string that is not a Kubernetes quantity, or a value Kubernetes would not store."""


def parse_quantity(text: str) -> Fraction:
    """``"2"``, ``"2000m"``, ``"1.5Gi"``, ``"1e3"`` -> the exact value; raises ``QuantityError``.

    Surrounding whitespace is ignored, as the API server's JSON decoding trims it.
    """
    stripped = text.strip()
    if _PLAIN.fullmatch(stripped):
        return Fraction(int(stripped))
    if len(stripped) > MAX_QUANTITY_CHARS:
        raise QuantityError(f"quantity of {len(stripped)} characters; the limit is {MAX_QUANTITY_CHARS}")
    match = _QUANTITY.fullmatch(stripped)
    if match is None:
        raise QuantityError(
            f"{text!r} is not a Kubernetes quantity (ASCII digits, optional sign and fraction, "
            "then one of Ki Mi Gi Ti Pi Ei, n u m k M G T P E, or an exponent e<int>)"
        )
    value = Fraction(match["number"]) * _scale(match)
    if abs(value) > MAX_STORED:
        raise QuantityError(f"quantity {text!r} is larger than Kubernetes stores (2^63-1)")
    return -value if match["sign"] == "-" else value


def _scale(match: re.Match[str]) -> Fraction:
    if match["binary"]:
        return Fraction(2 ** _BINARY[match["binary"]])
    if match["decimal"]:
        return Fraction(10) ** _DECIMAL[match["decimal"]]
    if match["exponent"]:
        exponent = int(match["exponent"][1:])
        if exponent > MAX_EXPONENT:
            return Fraction(10) ** (MAX_EXPONENT + 1)  # past MAX_STORED: refused by the caller
        return Fraction(10) ** max(exponent, -MAX_EXPONENT)
    return Fraction(1)


def whole_units(text: str) -> int:
    """A quantity that must be a whole non-negative number (an extended resource's count)."""
    stripped = text.strip()
    if _PLAIN.fullmatch(stripped):  # "2": the common spelling, without the exact-fraction path
        return int(stripped)
    value = parse_quantity(text)
    if value.denominator != 1:
        raise QuantityError(
            f"{text!r} is not a whole number; extended resources are requested in whole units"
        )
    if value < 0:
        raise QuantityError(f"{text!r} is negative")
    return int(value)
