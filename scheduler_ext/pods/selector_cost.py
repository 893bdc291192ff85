"""A static worst-case cost for a selector, counted before it ever runs.

The CEL library compiles and runs expressions but tracks no cost, and a running program holds the
GIL. Kubernetes refuses a DRA selector whose estimated cost passes 1,000,000 ("roughly 0.1 second
for each expression"); this module estimates the same kind of figure so that a selector asking
for millions of steps is refused when it is first seen, with the number in the reason.

The estimate is an upper bound in Kubernetes' units (one unit per node visited, one per element
a comprehension iterates, a tenth per character a string function reads). It parses CEL's
grammar into sizes and costs only, never values: a list literal's size is its element count, a
comprehension costs its range's size times its body, ``device``'s maps are as large as
``DeviceAttributes`` makes them. A construct it cannot size gets ``UNKNOWN_SIZE``. An expression
it cannot parse gets no estimate (``None``); it then runs only in the sandbox, under its deadline.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

COST_LIMIT = 1_000_000  # Kubernetes' per-expression CEL cost limit for DRA device selectors
UNKNOWN_SIZE = 10 * 1024  # a list or string of unknown length: as long as the longest expression
STRING_ATTRIBUTE = 256  # a device's string attributes (product names, versions) are shorter
_CONSTANTS = frozenset({"true", "false", "null"})
MACROS = frozenset({"all", "exists", "exists_one", "map", "filter"})
_STRING_FUNCTIONS = frozenset({"matches", "contains", "startsWith", "endsWith", "size", "string"})
_TOKEN = re.compile(
    r"""(?P<space>\s+|//[^\n]*)
    |(?P<string>[rR]?[bB]?[rR]?(?:\"\"\"(?:\\.|[^\\])*?\"\"\"|'''(?:\\.|[^\\])*?'''|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'))
    |(?P<number>0[xX][0-9a-fA-F]+[uU]?|[0-9]+\.[0-9]*(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?
        |[0-9]+[eE][+-]?[0-9]+|[0-9]+[uU]?)
    |(?P<ident>[A-Za-z_][A-Za-z0-9_]*)
    |(?P<op>\|\||&&|==|!=|<=|>=|[-+*/%!<>?:.,\[\](){}])""",
    re.VERBOSE | re.ASCII,
)
_BINARY_LEVELS: tuple[frozenset[str], ...] = (
    frozenset({"||"}),
    frozenset({"&&"}),
    frozenset({"==", "!=", "<", "<=", ">", ">=", "in"}),
    frozenset({"+", "-"}),
    frozenset({"*", "/", "%"}),
)


class CostParseError(ValueError):
    """The estimator does not understand the expression (it may still be valid CEL)."""


@dataclass(frozen=True)
class Est:
    """An expression's worst-case cost, and the size of what it yields (with its elements')."""

    cost: int
    size: int = 1
    elem: Est | None = None


SCALAR = Est(cost=0)
_STRING = Est(cost=0, size=STRING_ATTRIBUTE)
_UNKNOWN = Est(cost=0, size=UNKNOWN_SIZE, elem=Est(cost=0, size=UNKNOWN_SIZE))
_DOMAIN = Est(cost=0, size=32, elem=_STRING)  # DRA allows 32 attributes and capacities per device
DEVICE = Est(cost=0, size=4, elem=Est(cost=0, size=2, elem=_DOMAIN))


@dataclass(frozen=True)
class Estimate:
    """``cost``: worst case in Kubernetes' units; ``comprehensions``: how many loops it holds."""

    cost: int
    comprehensions: int


def estimate(expression: str) -> Estimate | None:
    """The worst-case cost of evaluating ``expression`` once, or None if it cannot be parsed here."""
    try:
        tokens = _tokenize(expression)
        parser = _Parser(tokens)
        result = parser.expression(scope={"device": DEVICE})
        parser.expect_end()
    except (CostParseError, RecursionError):
        return None
    return Estimate(cost=result.cost, comprehensions=parser.comprehensions)


def _tokenize(expression: str) -> list[tuple[str, str]]:
    tokens: list[tuple[str, str]] = []
    position = 0
    while position < len(expression):
        match = _TOKEN.match(expression, position)
        if match is None or match.end() == position:
            raise CostParseError(f"cannot read the selector at character {position}")
        kind = match.lastgroup or ""
        if kind != "space":
            tokens.append((kind, match.group()))
        position = match.end()
    return tokens


def _join(left: Est | None, right: Est | None) -> Est | None:
    """A value that is one of two: the larger of each size."""
    if left is None or right is None:
        return left or right
    return Est(cost=0, size=max(left.size, right.size), elem=_join(left.elem, right.elem))


class _Parser:
    """Recursive descent over CEL's grammar, computing ``Est`` instead of a syntax tree."""

    def __init__(self, tokens: list[tuple[str, str]]) -> None:
        self._tokens = tokens
        self._at = 0
        self.comprehensions = 0

    # ---- token plumbing ---------------------------------------------------------------------------
    def _peek(self) -> str:
        return self._tokens[self._at][1] if self._at < len(self._tokens) else ""

    def _next(self) -> tuple[str, str]:
        if self._at >= len(self._tokens):
            raise CostParseError("the selector ends early")
        self._at += 1
        return self._tokens[self._at - 1]

    def _take(self, text: str) -> bool:
        if self._peek() == text:
            self._at += 1
            return True
        return False

    def _expect(self, text: str) -> None:
        if not self._take(text):
            raise CostParseError(f"expected {text!r} at token {self._at}")

    def expect_end(self) -> None:
        if self._at != len(self._tokens):
            raise CostParseError(f"unexpected {self._peek()!r} at token {self._at}")

    # ---- grammar ----------------------------------------------------------------------------------
    def expression(self, *, scope: dict[str, Est]) -> Est:
        condition = self._binary(0, scope)
        if not self._take("?"):
            return condition
        then = self.expression(scope=scope)
        self._expect(":")
        otherwise = self.expression(scope=scope)
        joined = _join(then, otherwise) or SCALAR
        cost = condition.cost + then.cost + otherwise.cost + 1
        return Est(cost=cost, size=joined.size, elem=joined.elem)

    def _binary(self, level: int, scope: dict[str, Est]) -> Est:
        if level == len(_BINARY_LEVELS):
            return self._unary(scope)
        left = self._binary(level + 1, scope)
        while self._peek() in _BINARY_LEVELS[level]:
            operator = self._next()[1]
            right = self._binary(level + 1, scope)
            left = _operate(operator, left, right)
        return left

    def _unary(self, scope: dict[str, Est]) -> Est:
        if self._peek() in ("!", "-"):
            self._next()
            inner = self._unary(scope)
            return Est(cost=inner.cost + 1, size=inner.size, elem=inner.elem)
        return self._member(scope)

    def _member(self, scope: dict[str, Est]) -> Est:
        value = self._primary(scope)
        while True:
            if self._take("."):
                value = self._select(value, scope)
            elif self._take("["):
                index = self.expression(scope=scope)
                self._expect("]")
                inner = value.elem or _UNKNOWN
                value = Est(cost=value.cost + index.cost + 1, size=inner.size, elem=inner.elem)
            elif self._peek() == "{":
                value = self._message(value, scope)
            else:
                return value

    def _select(self, target: Est, scope: dict[str, Est]) -> Est:
        kind, name = self._next()
        if kind != "ident":
            raise CostParseError(f"expected a field name after '.', got {name!r}")
        if self._peek() != "(":
            inner = target.elem or _UNKNOWN
            return Est(cost=target.cost + 1, size=inner.size, elem=inner.elem)
        self._expect("(")
        if name in MACROS:
            return self._comprehension(name, target, scope)
        args = self._arguments(scope)
        return _call(name, [target, *args])

    def _comprehension(self, name: str, target: Est, scope: dict[str, Est]) -> Est:
        self.comprehensions += 1
        kind, variable = self._next()
        if kind != "ident":
            raise CostParseError(f"{name}() needs a variable name first, got {variable!r}")
        self._expect(",")
        inner = {**scope, variable: target.elem or _UNKNOWN}
        bodies = [self.expression(scope=inner)]
        while self._take(","):
            bodies.append(self.expression(scope=inner))
        self._expect(")")
        per_element = sum(body.cost for body in bodies) + 1
        cost = target.cost + target.size * per_element
        if name == "map":
            return Est(cost=cost, size=target.size, elem=bodies[-1])
        if name == "filter":
            return Est(cost=cost, size=target.size, elem=target.elem)
        return Est(cost=cost)

    def _primary(self, scope: dict[str, Est]) -> Est:
        kind, text = self._next()
        if kind == "string":
            return Est(cost=0, size=len(text))
        if kind == "number":
            return SCALAR
        if kind == "ident":
            return self._identifier(text, scope)
        if text == ".":
            return self._primary(scope)
        if text == "(":
            inner = self.expression(scope=scope)
            self._expect(")")
            return inner
        if text == "[":
            return self._list(scope)
        if text == "{":
            return self._map(scope)
        raise CostParseError(f"unexpected {text!r}")

    def _identifier(self, name: str, scope: dict[str, Est]) -> Est:
        if name in _CONSTANTS and name not in scope:
            return SCALAR
        if self._peek() != "(":
            known = scope.get(name)
            if known is None:
                return Est(cost=1, size=_UNKNOWN.size, elem=_UNKNOWN.elem)
            return Est(cost=1, size=known.size, elem=known.elem)
        self._expect("(")
        args = self._arguments(scope)
        if name == "has":
            return Est(cost=sum(a.cost for a in args) + 1)
        return _call(name, args)

    def _arguments(self, scope: dict[str, Est]) -> list[Est]:
        return self._items(")", scope)

    def _items(self, closing: str, scope: dict[str, Est]) -> list[Est]:
        items: list[Est] = []
        while not self._take(closing):
            items.append(self.expression(scope=scope))
            if not self._take(","):
                self._expect(closing)
                break
        return items

    def _list(self, scope: dict[str, Est]) -> Est:
        items = self._items("]", scope)
        elem = None
        for item in items:
            elem = _join(elem, item)
        return Est(cost=sum(i.cost for i in items) + 1, size=len(items), elem=elem)

    def _map(self, scope: dict[str, Est]) -> Est:
        cost, entries, elem = 1, 0, None
        while not self._take("}"):
            key = self.expression(scope=scope)
            self._expect(":")
            value = self.expression(scope=scope)
            cost, entries, elem = cost + key.cost + value.cost, entries + 1, _join(elem, _join(key, value))
            if not self._take(","):
                self._expect("}")
                break
        return Est(cost=cost, size=entries, elem=elem)

    def _message(self, target: Est, scope: dict[str, Est]) -> Est:
        self._expect("{")
        cost = target.cost + 1
        while not self._take("}"):
            self._next()  # field name
            self._expect(":")
            cost += self.expression(scope=scope).cost
            if not self._take(","):
                self._expect("}")
                break
        return Est(cost=cost)


def _operate(operator: str, left: Est, right: Est) -> Est:
    cost = left.cost + right.cost + 1
    if operator == "+":  # concatenation copies both sides; for numbers the sizes are 1
        joined = _join(left.elem, right.elem)
        return Est(cost=cost + (left.size + right.size) // 10, size=left.size + right.size, elem=joined)
    if operator in ("==", "!=", "in"):  # comparing lists or strings, or searching a list
        return Est(cost=cost + max(left.size, right.size))
    return Est(cost=cost)


def _call(name: str, args: list[Est]) -> Est:
    """A function call: its arguments, plus a tenth per character it reads (Kubernetes' rate)."""
    cost = sum(a.cost for a in args) + 1
    if name in _STRING_FUNCTIONS:
        cost += sum(a.size for a in args) // 10 + (sum(a.size for a in args) if name == "matches" else 0)
    if name == "dyn" and args:
        return Est(cost=cost, size=args[0].size, elem=args[0].elem)
    if name == "string":
        return Est(cost=cost, size=max((a.size for a in args), default=1) + 24)
    return Est(cost=cost)
