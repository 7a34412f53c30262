"""Step 2 of :func:`~.regex_automaton.compile_regex`: Thompson's construction.

Thompson's construction (Thompson 1968) turns the syntax tree of :mod:`.regex_parse` into a
*nondeterministic* automaton with ε-moves (:class:`NFA`), a few states per piece of the
pattern. Nondeterministic: after some text, the automaton can be in several states at once;
:mod:`.dfa` makes it deterministic.
"""

from __future__ import annotations

from .charset import CharSet
from .regex_parse import Alt, Chars, Concat, Node


class NFA:
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

    def build(self, node: Node) -> tuple[int, int]:
        """Add the fragment of ``node``; return its (start, end) states."""
        start, end = self.new_state(), self.new_state()
        if isinstance(node, Chars):
            self.moves[start].append((node.chars, end))
        elif isinstance(node, Concat):
            here = start
            for part in node.parts:
                part_start, part_end = self.build(part)
                self.epsilon[here].append(part_start)
                here = part_end
            self.epsilon[here].append(end)
        elif isinstance(node, Alt):
            for option in node.options:
                option_start, option_end = self.build(option)
                self.epsilon[start].append(option_start)
                self.epsilon[option_end].append(end)
        else:  # Star: skip the item, or do it and go round again
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
