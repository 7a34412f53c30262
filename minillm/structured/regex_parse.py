"""Step 1 of :func:`~.regex_automaton.compile_regex`: parse a pattern into a syntax tree.

The tree is small: character sets, concatenation, alternation and the Kleene star, the other
quantifiers being rewritten into these (``x+`` is ``xx*``, ``x{2,3}`` is ``xx(x)?``).

The supported syntax is the common core of regular expressions, with the meaning of Python's
``re.fullmatch(pattern, text, re.ASCII)``: literals and escaped punctuation (``\\.``,
``\\{``), ``\\n \\t \\r \\f \\v``, ``\\d \\w \\s`` (ASCII) and their complements
``\\D \\W \\S``, ``.`` (anything but a newline), classes ``[a-z0-9_]`` and ``[^"\\\\]``, groups
``( )`` and ``(?: )``, ``|``, and the greedy quantifiers ``* + ? {m} {m,} {m,n}``. Anything else
(anchors, backreferences, lookarounds, lazy quantifiers, flags...) is refused with a
``ValueError`` that names the piece and its position: an automaton cannot do backreferences,
and the rest means nothing when the whole output must match. So is a ``{`` that does not open
a quantifier, which Python would read as a literal brace: write ``\\{``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NoReturn

from .charset import ANY_BUT_NEWLINE, CONTROLS, DIGIT, SPACE, WORD, CharSet

_CLASS_ESCAPES = {
    "d": DIGIT, "w": WORD, "s": SPACE,
    "D": DIGIT.complement(), "W": WORD.complement(), "S": SPACE.complement(),
}
_BRACES = re.compile(r"\{([0-9]*)(,?)([0-9]*)\}")
_UNSUPPORTED_ESCAPES = {
    "b": "word-boundary anchor", "B": "word-boundary anchor", "A": "anchor", "Z": "anchor",
}

# The syntax tree has four kinds of node. Quantifiers are rewritten into them while parsing.


@dataclass(frozen=True)
class Chars:
    """One character from a set."""

    chars: CharSet


@dataclass(frozen=True)
class Concat:
    """The parts one after the other (no parts: the empty string)."""

    parts: tuple[Node, ...]


@dataclass(frozen=True)
class Alt:
    """Any one of the options."""

    options: tuple[Node, ...]


@dataclass(frozen=True)
class Star:
    """The item zero or more times."""

    item: Node


Node = Chars | Concat | Alt | Star
_EMPTY = Concat(())


def _repeat(item: Node, low: int, high: int | None) -> Node:
    """``item{low,high}`` (``high`` None: no upper bound) with concatenation, alternation and
    star: ``x{2,4}`` is ``xx(x(x)?)?``, ``x{2,}`` is ``xxx*``."""
    if high is None:
        tail = Star(item)
    else:
        tail = _EMPTY
        for _ in range(high - low):
            tail = Alt((Concat((item, tail)), _EMPTY))
    return Concat((item,) * low + (tail,))


class Parser:
    """A recursive-descent parser, one method per level of the grammar::

        alternation := concat ("|" concat)*
        concat      := (atom quantifier?)*
        atom        := "(" alternation ")" | "[" class "]" | "." | "\\" escape | character
    """

    def __init__(self, pattern: str):
        self.pattern = pattern
        self.pos = 0

    def parse(self) -> Node:
        tree = self.alternation()
        if self.pos < len(self.pattern):  # alternation() only stops early at a ")"
            self.fail("unbalanced parenthesis ')'")
        return tree

    def fail(self, what: str, pos: int | None = None) -> NoReturn:
        pos = self.pos if pos is None else pos
        raise ValueError(f"{what} at position {pos} of the regex {self.pattern!r}")

    def peek(self) -> str | None:
        return self.pattern[self.pos] if self.pos < len(self.pattern) else None

    def take(self) -> str:
        if self.pos >= len(self.pattern):
            self.fail("unexpected end of the pattern")
        self.pos += 1
        return self.pattern[self.pos - 1]

    def alternation(self) -> Node:
        options = [self.concat()]
        while self.peek() == "|":
            self.pos += 1
            options.append(self.concat())
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def concat(self) -> Node:
        parts = []
        while self.peek() not in (None, "|", ")"):
            parts.append(self.quantified(self.atom()))
        return parts[0] if len(parts) == 1 else Concat(tuple(parts))

    def atom(self) -> Node:
        start, char = self.pos, self.take()
        if char == "(":
            if self.peek() == "?":
                if self.pattern[self.pos + 1: self.pos + 2] != ":":
                    self.fail(f"unsupported group {self.pattern[start:self.pos + 2]!r}", start)
                self.pos += 2
            inner = self.alternation()
            if self.peek() != ")":
                self.fail("missing ')' for the group opened", start)
            self.pos += 1
            return inner
        if char == "[":
            return Chars(self.char_class(start))
        if char == ".":
            return Chars(ANY_BUT_NEWLINE)
        if char == "\\":
            return Chars(self.escape())
        if char in "^$":
            self.fail(f"unsupported anchor {char!r}", start)
        if char in "*+?" or (char == "{" and self.braces(start) is not None):
            self.fail(f"nothing to repeat for the quantifier {char!r}", start)
        if char == "{":
            self.fail("'{' that is not a quantifier (write \\{ for a literal brace)", start)
        return Chars(CharSet.of(char))

    def quantified(self, item: Node) -> Node:
        start, char = self.pos, self.peek()
        if char == "*":
            low, high = 0, None
        elif char == "+":
            low, high = 1, None
        elif char == "?":
            low, high = 0, 1
        elif char == "{" and (braces := self.braces(start)) is not None:
            low, high = int(braces[1] or 0), int(braces[3]) if braces[3] else None
            if not braces[2]:  # {m}
                high = low
        else:
            return item
        self.pos = braces.end() if char == "{" else start + 1
        following = self.peek()
        if following == "?":
            self.fail("unsupported lazy quantifier")
        if following == "+":
            self.fail("unsupported possessive quantifier")
        if following in ("*", "{"):
            self.fail("multiple repeat")
        if high is not None and low > high:
            self.fail("min repeat greater than max repeat", start)
        return _repeat(item, low, high)

    def braces(self, start: int) -> re.Match | None:
        """The quantifier ``{m}``, ``{m,}``, ``{m,n}`` or ``{,n}`` whose ``{`` is at ``start``
        (groups 1-3: m, the comma, n), or None if that brace does not open one."""
        braces = _BRACES.match(self.pattern, start)
        return braces if braces and (braces[1] or braces[2]) else None

    def escape(self) -> CharSet:
        """The set of the escape after a backslash: ``\\d``, ``\\n``, ``\\.``..."""
        start = self.pos - 1
        if self.peek() is None:
            self.fail("a backslash at the end of the pattern", start)
        char = self.take()
        if char in _CLASS_ESCAPES:
            return _CLASS_ESCAPES[char]
        if char in CONTROLS:
            return CharSet.of(CONTROLS[char])
        if char.isascii() and char.isalnum():  # other letters and digits mean other things
            kind = "backreference" if char.isdigit() else _UNSUPPORTED_ESCAPES.get(char, "escape")
            self.fail(f"unsupported {kind} '\\{char}'", start)
        return CharSet.of(char)  # escaped punctuation is itself

    def char_class(self, start: int) -> CharSet:
        """The set of a class ``[...]`` whose ``[`` is at ``start``. As in Python, a ``]``
        first in the class is a literal, and so is a ``-`` that cannot make a range."""
        negated = self.peek() == "^"
        self.pos += negated
        chars = CharSet(())
        first = True
        while True:
            if self.peek() is None:
                self.fail("unterminated character class", start)
            if self.peek() == "]" and not first:
                self.pos += 1
                return chars.complement() if negated else chars
            first = False
            item_start, item = self.pos, self.class_item()
            if self.peek() == "-" and self.pattern[self.pos + 1: self.pos + 2] not in ("", "]"):
                self.pos += 1
                end = self.class_item()
                low, high = item.single_char, end.single_char
                if low is None or high is None or low > high:
                    self.fail("bad character range", item_start)
                item = CharSet.span(low, high)
            chars = chars | item

    def class_item(self) -> CharSet:
        """One character or escape inside a class."""
        char = self.take()
        return self.escape() if char == "\\" else CharSet.of(char)
