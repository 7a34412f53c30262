"""Sets of characters: the labels of an automaton's transitions.

The alphabet is all of Unicode, so a transition is labelled with a :class:`CharSet`, a set of
code-point ranges, rather than with one character: ``[^"\\\\]`` is three ranges, not a million
transitions. A set prints as the regex syntax that denotes it, so a transition table reads
like the pattern.

The named sets of the escapes ``\\d \\w \\s`` (ASCII, as with ``re.ASCII``) and of ``.``
are here too.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_CODE_POINT = 0x10FFFF


@dataclass(frozen=True)
class CharSet:
    """A set of characters: sorted, disjoint, non-adjacent inclusive code-point ranges.

    The ranges are normalised on construction, so two equal sets compare (and hash) equal.
    Negation is normalised away too: ``[^"]`` is stored as ``(0, 33), (35, 0x10FFFF)``.
    """

    ranges: tuple[tuple[int, int], ...]

    def __post_init__(self):
        merged: list[tuple[int, int]] = []
        for lo, hi in sorted(self.ranges):
            if not 0 <= lo <= hi <= MAX_CODE_POINT:
                raise ValueError(f"bad code-point range ({lo}, {hi})")
            if merged and lo <= merged[-1][1] + 1:  # overlapping or adjacent: merge
                merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
            else:
                merged.append((lo, hi))
        object.__setattr__(self, "ranges", tuple(merged))

    @classmethod
    def of(cls, chars: str) -> CharSet:
        """The set of the given characters."""
        return cls(tuple((ord(c), ord(c)) for c in chars))

    @classmethod
    def span(cls, lo: str, hi: str) -> CharSet:
        """The characters from ``lo`` to ``hi``, both included (a class range ``[lo-hi]``)."""
        return cls(((ord(lo), ord(hi)),))

    def contains(self, char: str) -> bool:
        """Whether ``char`` is in the set."""
        code = ord(char)
        return any(lo <= code <= hi for lo, hi in self.ranges)

    def __or__(self, other: CharSet) -> CharSet:
        return CharSet(self.ranges + other.ranges)

    def complement(self) -> CharSet:
        """Every character not in the set (``[^...]``)."""
        gaps, start = [], 0
        for lo, hi in self.ranges:
            if lo > start:
                gaps.append((start, lo - 1))
            start = hi + 1
        if start <= MAX_CODE_POINT:
            gaps.append((start, MAX_CODE_POINT))
        return CharSet(tuple(gaps))

    @property
    def single_char(self) -> str | None:
        """The one character of a one-character set, else None."""
        if len(self.ranges) == 1 and self.ranges[0][0] == self.ranges[0][1]:
            return chr(self.ranges[0][0])
        return None

    def __str__(self) -> str:
        """As regex syntax: ``"``, ``\\.``, ``[0-9]``, ``[^"\\\\]``."""
        if self.single_char is not None and self.single_char != " ":  # a space shows as [ ]
            return _escape(self.single_char, _META)
        if not self.ranges:
            return "[]"  # the empty set (never a label)
        if self.ranges[-1][1] == MAX_CODE_POINT:  # mostly everything: show what is missing
            missing = self.complement()
            return "[^" + _class_body(missing) + "]" if missing.ranges else "(any)"
        return "[" + _class_body(self) + "]"


_META = set(".^$*+?{}[]\\|()")
# Escapes of control characters: \n in a pattern is a newline, and so on.
CONTROLS = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v"}
_CONTROL_ESCAPES = {char: "\\" + letter for letter, char in CONTROLS.items()}


def _escape(char: str, special: set[str]) -> str:
    """One character as it would be written in a pattern."""
    code = ord(char)
    if char in _CONTROL_ESCAPES:
        return _CONTROL_ESCAPES[char]
    if char.isprintable():
        return "\\" + char if char in special else char
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _class_body(chars: CharSet) -> str:
    """What goes between the brackets of a class: ``a-z0-9_``."""
    special = set("\\]^-[")
    parts = []
    for lo, hi in chars.ranges:
        first = _escape(chr(lo), special)
        if hi == lo:
            parts.append(first)
        elif hi == lo + 1:
            parts.append(first + _escape(chr(hi), special))
        else:
            parts.append(f"{first}-{_escape(chr(hi), special)}")
    return "".join(parts)


DIGIT = CharSet.span("0", "9")
WORD = CharSet.span("a", "z") | CharSet.span("A", "Z") | DIGIT | CharSet.of("_")
SPACE = CharSet.of(" \t\n\r\f\v")
ANY_BUT_NEWLINE = CharSet.of("\n").complement()
