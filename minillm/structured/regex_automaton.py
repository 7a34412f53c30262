"""From a regular expression to a deterministic automaton over characters.

Constrained decoding asks, at every step, "which tokens can the output continue with and still
match the pattern?". The classic answer compiles the pattern once into a *deterministic finite
automaton* (DFA): a state is "what has been read so far, as far as the pattern cares", and each
character moves it to exactly one next state, or to nowhere when no continuation can match any
more. A later lesson walks every vocabulary token through the DFA to build a token mask.

:func:`compile_regex` does it in four steps, each a textbook algorithm in its own module:

1. **parse** the pattern into a small syntax tree (:mod:`.regex_parse`): character sets,
   concatenation, alternation and the Kleene star;
2. **Thompson's construction** turns the tree into a *nondeterministic* automaton with
   ε-moves (:mod:`.nfa`);
3. the **subset construction** makes it deterministic, and the states from which no match can
   be reached any more are dropped (:mod:`.dfa`);
4. **Moore's algorithm** merges the states that behave the same on every continuation
   (:mod:`.dfa`): the smallest DFA for the pattern.

The transitions are labelled with sets of characters (:mod:`.charset`), since the alphabet is
all of Unicode. The result is a :class:`CharAutomaton`; :func:`forced_text` reads from it the
text that is the only way forward from a state.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field

from .charset import CharSet
from .dfa import determinize, live_states, minimize, prune
from .nfa import NFA
from .regex_parse import Parser


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
        return live_states(self.accepting, self.transitions)

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


def thompson_nfa(pattern: str) -> tuple[NFA, int, int]:
    """Steps 1 and 2: ``pattern``'s NFA and its (start, end) states; the text matches when
    reading it can lead from ``start`` to ``end``."""
    nfa = NFA()
    start, end = nfa.build(Parser(pattern).parse())
    return nfa, start, end


def compile_regex(pattern: str) -> CharAutomaton:
    """The DFA of ``pattern`` (matching as ``re.fullmatch(pattern, text, re.ASCII)`` does)."""
    dfa = prune(*determinize(*thompson_nfa(pattern)))
    return CharAutomaton(*prune(*minimize(*dfa)))  # pruning again numbers the merged states
