"""From a regular expression to a deterministic automaton over characters.

Constrained decoding asks, at every step, "which tokens can the output continue with and still
match the pattern?". The classic answer compiles the pattern once into a *deterministic finite
automaton* (DFA): a state is "what has been read so far, as far as the pattern cares", and each
character moves it to exactly one next state, or to nowhere when no continuation can match any
more. A later lesson walks every vocabulary token through the DFA to build a token mask.

The compilation has four steps, each a textbook algorithm:

1. **parse** the pattern into a small syntax tree (:class:`_Parser`): character sets,
   concatenation, alternation and the Kleene star, the other quantifiers being rewritten into
   these (``x+`` is ``xx*``, ``x{2,3}`` is ``xx(x)?``);
2. **Thompson's construction** (Thompson 1968) turns the tree into a *nondeterministic*
   automaton with ε-moves (:class:`_NFA`), a few states per piece of the pattern;
3. the **subset construction** (Rabin & Scott 1959) makes it deterministic: a DFA state is the
   set of NFA states the text could have led to (:func:`_determinize`). States from which no
   accepting state can be reached are then dropped (:func:`_prune`), so "no next state" means
   "dead": the text so far cannot be completed into a match;
4. **Moore's algorithm** (Moore 1956) merges the states that behave the same on every
   continuation (:func:`_minimize`): the smallest DFA for the pattern, and the smallest
   transition table to read.

The alphabet is all of Unicode, so a transition is labelled with a :class:`CharSet`, a set of
code-point ranges, rather than with one character: ``[^"\\\\]`` is three ranges, not a million
transitions. The labels leaving a DFA state are disjoint, so a character has at most one next
state.

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
from bisect import bisect_right
from collections import deque
from dataclasses import dataclass, field
from typing import NoReturn

MAX_CODE_POINT = 0x10FFFF

# ----------------------------------------------------------------------------- character sets


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
_CONTROLS = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v"}
_CONTROL_ESCAPES = {char: "\\" + letter for letter, char in _CONTROLS.items()}


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
_CLASS_ESCAPES = {
    "d": DIGIT, "w": WORD, "s": SPACE,
    "D": DIGIT.complement(), "W": WORD.complement(), "S": SPACE.complement(),
}
_BRACES = re.compile(r"\{([0-9]*)(,?)([0-9]*)\}")
_UNSUPPORTED_ESCAPES = {
    "b": "word-boundary anchor", "B": "word-boundary anchor", "A": "anchor", "Z": "anchor",
}

# ----------------------------------------------------------------------------- the automaton


@dataclass(frozen=True)
class CharAutomaton:
    """A deterministic finite automaton over characters.

    States are ``0 .. num_states - 1``; every state can still reach an accepting state, so
    :meth:`step` returning None means the text read so far can no longer be completed into
    a match.
    """

    initial: int
    accepting: frozenset[int]
    transitions: tuple[tuple[tuple[CharSet, int], ...], ...]  # per state: (label, next state)
    # Lookup tables for step(), derived from the transitions: per state, the sorted starts of
    # the code-point intervals its labels cut Unicode into and each interval's next state
    # (None: dead), and a memo of the characters already looked up.
    _tables: tuple[tuple[list[int], list[int | None]], ...] = field(
        init=False, repr=False, compare=False)
    _memo: tuple[dict[str, int | None], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        """Build the lookup tables of :meth:`step`."""
        tables = []
        for moves in self.transitions:
            starts, targets = [0], [None]
            for (lo, hi), target in sorted((r, t) for label, t in moves for r in label.ranges):
                if starts[-1] == lo:  # the interval starts where the previous gap did
                    targets[-1] = target
                else:
                    starts.append(lo)
                    targets.append(target)
                starts.append(hi + 1)
                targets.append(None)
            tables.append((starts, targets))
        object.__setattr__(self, "_tables", tuple(tables))
        object.__setattr__(self, "_memo", tuple({} for _ in self.transitions))

    @property
    def num_states(self) -> int:
        return len(self.transitions)

    def step(self, state: int, char: str) -> int | None:
        """The state after reading ``char`` in ``state``; None if no match can follow.

        A binary search over the state's interval starts, remembered per character: building
        a token mask asks about the same few hundred characters hundreds of thousands of times.
        """
        memo = self._memo[state]
        if char in memo:
            return memo[char]
        starts, targets = self._tables[state]
        target = memo[char] = targets[bisect_right(starts, ord(char)) - 1]
        return target

    def walk(self, state: int, text: str) -> int | None:
        """The state after reading ``text`` from ``state``; None as soon as it is dead."""
        for char in text:
            state = self.step(state, char)
            if state is None:
                return None
        return state

    def matches(self, text: str) -> bool:
        """Whether the whole of ``text`` matches the pattern."""
        state = self.walk(self.initial, text)
        return state is not None and state in self.accepting

    def is_accepting(self, state: int) -> bool:
        return state in self.accepting

    def live_states(self) -> frozenset[int]:
        """The states from which an accepting state can be reached (all of them, once
        :func:`compile_regex` has pruned the dead ones, unless the pattern matches nothing)."""
        return _live(self.accepting, self.transitions)

    def describe(self) -> str:
        """The transition table, one line per state: ``1: [^"\\\\] -> 1, " -> 2, \\\\ -> 3``."""
        lines = []
        for state, moves in enumerate(self.transitions):
            marks = ["start"] * (state == self.initial) + ["accept"] * (state in self.accepting)
            name = f"{state} ({', '.join(marks)})" if marks else str(state)
            moves_text = ", ".join(f"{label} -> {target}" for label, target in moves)
            lines.append(f"{name}: {moves_text or '(no moves)'}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.describe()


def forced_text(automaton: CharAutomaton, state: int) -> str:
    """The longest text that is the only way forward from ``state``.

    While the state is not accepting (stopping there is allowed) and exactly one character
    leaves it, that character is forced. Jump-forward decoding appends such text without
    running the model. The loop ends: a cycle of forced, non-accepting states could never
    reach an accepting one, and such dead states have been pruned.
    """
    text = []
    while state not in automaton.accepting and len(automaton.transitions[state]) == 1:
        [(label, target)] = automaton.transitions[state]
        if label.single_char is None:
            break
        text.append(label.single_char)
        state = target
    return "".join(text)


def compile_regex(pattern: str) -> CharAutomaton:
    """The DFA of ``pattern`` (matching as ``re.fullmatch(pattern, text, re.ASCII)`` does)."""
    nfa = _NFA()
    start, end = nfa.build(_Parser(pattern).parse())
    dfa = _prune(*_determinize(nfa, start, end))
    return CharAutomaton(*_prune(*_minimize(*dfa)))  # pruning again numbers the merged states


# ----------------------------------------------------------------------------- 1. parsing
# The syntax tree has four kinds of node. Quantifiers are rewritten into them while parsing.


@dataclass(frozen=True)
class _Chars:
    """One character from a set."""

    chars: CharSet


@dataclass(frozen=True)
class _Concat:
    """The parts one after the other (no parts: the empty string)."""

    parts: tuple[_Node, ...]


@dataclass(frozen=True)
class _Alt:
    """Any one of the options."""

    options: tuple[_Node, ...]


@dataclass(frozen=True)
class _Star:
    """The item zero or more times."""

    item: _Node


_Node = _Chars | _Concat | _Alt | _Star
_EMPTY = _Concat(())


def _repeat(item: _Node, low: int, high: int | None) -> _Node:
    """``item{low,high}`` (``high`` None: no upper bound) with concatenation, alternation and
    star: ``x{2,4}`` is ``xx(x(x)?)?``, ``x{2,}`` is ``xxx*``."""
    if high is None:
        tail = _Star(item)
    else:
        tail = _EMPTY
        for _ in range(high - low):
            tail = _Alt((_Concat((item, tail)), _EMPTY))
    return _Concat((item,) * low + (tail,))


class _Parser:
    """A recursive-descent parser, one method per level of the grammar::

        alternation := concat ("|" concat)*
        concat      := (atom quantifier?)*
        atom        := "(" alternation ")" | "[" class "]" | "." | "\\" escape | character
    """

    def __init__(self, pattern: str):
        self.pattern = pattern
        self.pos = 0

    def parse(self) -> _Node:
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

    def alternation(self) -> _Node:
        options = [self.concat()]
        while self.peek() == "|":
            self.pos += 1
            options.append(self.concat())
        return options[0] if len(options) == 1 else _Alt(tuple(options))

    def concat(self) -> _Node:
        parts = []
        while self.peek() not in (None, "|", ")"):
            parts.append(self.quantified(self.atom()))
        return parts[0] if len(parts) == 1 else _Concat(tuple(parts))

    def atom(self) -> _Node:
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
            return _Chars(self.char_class(start))
        if char == ".":
            return _Chars(ANY_BUT_NEWLINE)
        if char == "\\":
            return _Chars(self.escape())
        if char in "^$":
            self.fail(f"unsupported anchor {char!r}", start)
        if char in "*+?" or (char == "{" and self.braces(start) is not None):
            self.fail(f"nothing to repeat for the quantifier {char!r}", start)
        if char == "{":
            self.fail("'{' that is not a quantifier (write \\{ for a literal brace)", start)
        return _Chars(CharSet.of(char))

    def quantified(self, item: _Node) -> _Node:
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
        if char in _CONTROLS:
            return CharSet.of(_CONTROLS[char])
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


# ----------------------------------------------------------------------------- 2. Thompson


class _NFA:
    """A nondeterministic automaton with ε-moves, built by Thompson's construction: each
    piece of the tree becomes a fragment with one start and one end state, and the fragments
    are wired together with ε-moves."""

    def __init__(self):
        self.epsilon: list[list[int]] = []  # per state: states reachable without reading
        self.moves: list[list[tuple[CharSet, int]]] = []  # per state: (label, next state)

    def new_state(self) -> int:
        self.epsilon.append([])
        self.moves.append([])
        return len(self.epsilon) - 1

    def build(self, node: _Node) -> tuple[int, int]:
        """Add the fragment of ``node``; return its (start, end) states."""
        start, end = self.new_state(), self.new_state()
        if isinstance(node, _Chars):
            self.moves[start].append((node.chars, end))
        elif isinstance(node, _Concat):
            here = start
            for part in node.parts:
                part_start, part_end = self.build(part)
                self.epsilon[here].append(part_start)
                here = part_end
            self.epsilon[here].append(end)
        elif isinstance(node, _Alt):
            for option in node.options:
                option_start, option_end = self.build(option)
                self.epsilon[start].append(option_start)
                self.epsilon[option_end].append(end)
        else:  # _Star: skip the item, or do it and go round again
            item_start, item_end = self.build(node.item)
            self.epsilon[start] += [item_start, end]
            self.epsilon[item_end] += [item_start, end]
        return start, end

    def closure(self, states) -> frozenset[int]:
        """The states reachable from ``states`` by ε-moves alone (themselves included)."""
        seen, todo = set(states), list(states)
        while todo:
            for nxt in self.epsilon[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return frozenset(seen)


# ----------------------------------------------------------------------------- 3. subsets


def _split(moves: list[tuple[CharSet, int]]) -> dict[frozenset[int], CharSet]:
    """Cut overlapping labels into disjoint ones: for each set of targets, the characters
    that lead to exactly those targets.

    A sweep over the range boundaries of all the labels, in code-point order: at each one a
    label becomes active (a range of it starts) or inactive (one ends), and between two
    boundaries the characters lead to the targets of the active labels.
    """
    targets_of: dict[CharSet, set[int]] = {}  # the same label often leads to several states
    for label, target in moves:
        targets_of.setdefault(label, set()).add(target)
    labels = list(targets_of)
    boundaries = sorted((point, i) for i, label in enumerate(labels)
                        for lo, hi in label.ranges for point in (lo, hi + 1))
    active: set[int] = set()
    by_targets: dict[frozenset[int], list[tuple[int, int]]] = {}
    for (point, i), (next_point, _) in zip(boundaries, boundaries[1:], strict=False):
        active ^= {i}  # label i starts or stops here (its ranges never touch)
        if active and next_point > point:  # the characters point .. next_point - 1
            targets = frozenset().union(*(targets_of[labels[j]] for j in active))
            by_targets.setdefault(targets, []).append((point, next_point - 1))
    return {targets: CharSet(tuple(ranges)) for targets, ranges in by_targets.items()}


def _determinize(nfa: _NFA, start: int, end: int) -> tuple[int, set[int], list[list]]:
    """The subset construction: DFA state i stands for ``subsets[i]``, the NFA states a text
    can lead to. Returns (initial state, accepting states, transitions).

    Only the states that matter are kept in a subset: those that read a character, and the
    end. Two subsets that agree on these behave the same, so they become one DFA state.
    """
    reach: dict[int, frozenset[int]] = {}  # per NFA state: the states that matter after it

    def subset_after(states) -> frozenset[int]:
        for state in states:
            if state not in reach:
                reach[state] = frozenset(s for s in nfa.closure([state])
                                         if nfa.moves[s] or s == end)
        return frozenset().union(*(reach[state] for state in states))

    subsets = [subset_after([start])]
    index = {subsets[0]: 0}
    transitions = []
    for subset in subsets:  # the list grows as new subsets are found
        moves = [move for state in subset for move in nfa.moves[state]]
        ranges: dict[int, list[tuple[int, int]]] = {}  # per next DFA state: its characters
        for targets, chars in _split(moves).items():
            nxt = subset_after(targets)
            if nxt not in index:
                index[nxt] = len(subsets)
                subsets.append(nxt)
            # Different target sets can lead to the same subset: merge their labels.
            ranges.setdefault(index[nxt], []).extend(chars.ranges)
        transitions.append([(CharSet(tuple(r)), target) for target, r in ranges.items()])
    accepting = {i for i, subset in enumerate(subsets) if end in subset}
    return 0, accepting, transitions


def _live(accepting, transitions) -> frozenset[int]:
    """The states that can reach an accepting state: search backwards from those."""
    sources: list[list[int]] = [[] for _ in transitions]
    for state, moves in enumerate(transitions):
        for _, target in moves:
            sources[target].append(state)
    live, todo = set(accepting), list(accepting)
    while todo:
        for source in sources[todo.pop()]:
            if source not in live:
                live.add(source)
                todo.append(source)
    return frozenset(live)


_DFA = tuple[int, frozenset[int], tuple[tuple[tuple[CharSet, int], ...], ...]]
"""(initial state, accepting states, transitions): a DFA before it becomes a CharAutomaton."""


def _prune(initial: int, accepting, transitions) -> _DFA:
    """Drop the dead states and the moves into them; number the rest 0, 1, ... in the order
    a breadth-first walk from the initial state meets them (the initial state is 0)."""
    live = _live(accepting, transitions)
    if initial not in live:  # the pattern matches nothing: one state, no moves
        return 0, frozenset(), ((),)
    number, order = {initial: 0}, deque([initial])
    kept = []
    while order:
        state = order.popleft()
        moves = []
        for chars, target in sorted(transitions[state], key=lambda move: move[0].ranges):
            if target in live:
                if target not in number:
                    number[target] = len(number)
                    order.append(target)
                moves.append((chars, number[target]))
        kept.append(tuple(moves))
    return 0, frozenset(number[s] for s in accepting if s in number), tuple(kept)


def _minimize(initial: int, accepting: frozenset[int], transitions) -> _DFA:
    """Merge equivalent states by Moore's partition refinement.

    Start from two blocks, accepting and not; split a block when its states disagree on the
    block some character leads to; stop when nothing splits. The states left in one block
    accept the same continuations. (A missing move leads to the pruned dead state, which
    every live state differs from.)
    """
    intervals = [sorted((lo, hi, target) for chars, target in moves for lo, hi in chars.ranges)
                 for moves in transitions]  # per state: its moves, one code-point range each

    def moves_by_block(state: int, block: list[int]) -> tuple[tuple[int, int, int], ...]:
        """Where ``state`` goes, as (lo, hi, block) ranges, neighbours into the same block
        merged: the same for two states exactly when they agree on every character."""
        merged: list[tuple[int, int, int]] = []
        for lo, hi, target in intervals[state]:
            if merged and merged[-1][1] + 1 == lo and merged[-1][2] == block[target]:
                merged[-1] = (merged[-1][0], hi, block[target])
            else:
                merged.append((lo, hi, block[target]))
        return tuple(merged)

    block = [int(state in accepting) for state in range(len(transitions))]
    while True:
        signatures = [(block[s], moves_by_block(s, block)) for s in range(len(transitions))]
        # Blocks are numbered in order of first appearance, so once nothing splits any more
        # the refined numbering comes back identical.
        numbers = {signature: i for i, signature in enumerate(dict.fromkeys(signatures))}
        refined = [numbers[signature] for signature in signatures]
        if refined == block:
            break
        block = refined
    merged: list[tuple[tuple[CharSet, int], ...]] = [()] * len(numbers)
    for state in range(len(transitions)):
        ranges: dict[int, list[tuple[int, int]]] = {}
        for lo, hi, target_block in moves_by_block(state, block):
            ranges.setdefault(target_block, []).append((lo, hi))
        merged[block[state]] = tuple((CharSet(tuple(r)), b) for b, r in ranges.items())
    return block[initial], frozenset(block[s] for s in accepting), tuple(merged)
