"""Steps 3 and 4 of :func:`~.regex_automaton.compile_regex`: from the NFA to the minimal DFA.

3. The **subset construction** (Rabin & Scott 1959) makes the :class:`~.nfa.NFA`
   deterministic: a DFA state is the set of NFA states the text could have led to
   (:func:`determinize`). States from which no accepting state can be reached are then dropped
   (:func:`prune`), so "no next state" means "dead": the text so far cannot be completed into
   a match.
4. **Moore's algorithm** (Moore 1956) merges the states that behave the same on every
   continuation (:func:`minimize`): the smallest DFA for the pattern, and the smallest
   transition table to read.

The labels leaving a DFA state are disjoint, so a character has at most one next state.
"""

from __future__ import annotations

from collections import deque

from .charset import CharSet
from .nfa import NFA


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


def determinize(nfa: NFA, start: int, end: int) -> tuple[int, set[int], list[list]]:
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


def live_states(accepting, transitions) -> frozenset[int]:
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


def prune(initial: int, accepting, transitions) -> _DFA:
    """Drop the dead states and the moves into them; number the rest 0, 1, ... in the order
    a breadth-first walk from the initial state meets them (the initial state is 0)."""
    live = live_states(accepting, transitions)
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


def minimize(initial: int, accepting: frozenset[int], transitions) -> _DFA:
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
