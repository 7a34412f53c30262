"""Plausible wrong answers to chapter 16 (structured output); the graded tests must catch
each one. Each mutant replaces the solution function named before its ``__``. The mutants of
one exercise share a helper that makes the right thing with one mistake switched on."""

import torch

from minillm.structured.charset import MAX_CODE_POINT, CharSet
from minillm.structured.regex_automaton import CharAutomaton

# -- 16.1 determinize ---------------------------------------------------------------------------


def _pieces(moves, split):
    """{targets: ranges}: "exact" cuts the labels at every boundary; "none" keeps each
    move's label as it is; "merge" gives overlapping labels' union to their targets' union."""
    if split == "none":
        return [(frozenset([target]), list(label.ranges)) for label, target in moves]
    points = sorted({p for label, _ in moves for lo, hi in label.ranges for p in (lo, hi + 1)})
    by_targets = {}
    for lo, after in zip(points, points[1:], strict=False):
        targets = frozenset(t for label, t in moves if label.contains(chr(lo)))
        if targets:
            by_targets.setdefault(targets, []).append((lo, after - 1))
    if split == "merge":  # pieces whose targets share a state become one
        groups = []
        for targets, ranges in by_targets.items():
            overlapping = [g for g in groups if g[0] & targets]
            for g in overlapping:
                groups.remove(g)
                targets, ranges = targets | g[0], ranges + g[1]
            groups.append((targets, ranges))
        return groups
    return list(by_targets.items())


def _subsets(nfa, start, end, close_start=True, close_moves=True, split="exact",
             complete=False, prune=True):
    """The subset construction, with one mistake switched on by a flag."""
    subsets = [nfa.closure([start]) if close_start else frozenset([start])]
    number = {subsets[0]: 0}
    moves_of = []
    for subset in subsets:
        ranges = {}
        moves = [m for s in subset for m in nfa.moves[s]]
        found = _pieces(moves, split)
        if complete:  # the characters no label reads go to the empty subset
            covered = CharSet(tuple(r for _, rs in found for r in rs))
            if covered.complement().ranges:
                found = [*found, (frozenset(), list(covered.complement().ranges))]
        for targets, chars in found:
            following = nfa.closure(targets) if close_moves else frozenset(targets)
            if following not in number:
                number[following] = len(subsets)
                subsets.append(following)
            ranges.setdefault(number[following], []).extend(chars)
        moves_of.append(ranges)
    live = set(range(len(subsets))) if not prune else \
        {q for q, subset in enumerate(subsets) if end in subset}
    grew = prune
    while grew:
        grew = False
        for q, ranges in enumerate(moves_of):
            if q not in live and any(target in live for target in ranges):
                live.add(q)
                grew = True
    if 0 not in live:
        return CharAutomaton(0, frozenset(), ((),))
    new = {q: i for i, q in enumerate(sorted(live))}
    transitions = tuple(tuple((CharSet(tuple(r)), new[t]) for t, r in moves_of[q].items()
                              if t in live) for q in sorted(live))
    return CharAutomaton(0, frozenset(new[q] for q in live if end in subsets[q]), transitions)


def determinize__no_start_closure(nfa, start, end):
    """Starts from {start} without its ε-closure: a Thompson start state reads nothing."""
    return _subsets(nfa, start, end, close_start=False)


def determinize__moves_not_closed(nfa, start, end):
    """Forgets the ε-closure after a move: the subset holds only the moves' targets, so
    acceptance and the next moves behind ε-moves are lost."""
    return _subsets(nfa, start, end, close_moves=False)


def determinize__keeps_dead_states(nfa, start, end):
    """Builds the complete DFA: the characters a state cannot read lead to the empty subset,
    a dead state that stays in the automaton (walk no longer returns None)."""
    return _subsets(nfa, start, end, complete=True, prune=False)


def determinize__no_pruning(nfa, start, end):
    """Never drops the subsets that cannot reach the end (``a[^\\s\\S]|b`` keeps the
    state after "a")."""
    return _subsets(nfa, start, end, prune=False)


def determinize__overlapping_labels(nfa, start, end):
    """One DFA move per NFA move, labels not split: ``[a-c]`` and ``[b-d]`` overlap, so the
    automaton is not deterministic and "b" follows only one of them."""
    return _subsets(nfa, start, end, split="none")


def determinize__overlaps_merged(nfa, start, end):
    """Overlapping labels merged wholesale: the union of their characters goes to the union
    of their targets, so ``[a-c]x|[b-d]y`` accepts "ay"."""
    return _subsets(nfa, start, end, split="merge")


# -- 16.2 token_index ---------------------------------------------------------------------------


def _index(automaton, texts, stop_tokens, class_states=None, drop_last=False, first_only=False,
           stops=True, empty_allowed=False, start_only=False):
    """The class-table index, with one mistake switched on by a flag."""
    labels = [automaton.transitions[q] for q in (class_states or range(automaton.num_states))]
    cuts = sorted({0} | {p for moves in labels for label, _ in moves
                         for lo, hi in label.ranges for p in (lo, hi + 1) if p <= MAX_CODE_POINT})
    dead = automaton.num_states
    rows = [[dead if (n := automaton.step(q, chr(c))) is None else n for c in cuts]
            for q in range(automaton.num_states)]
    table = torch.tensor(rows + [[dead] * len(cuts)])
    stop_ids = torch.tensor(sorted(set(stop_tokens)), dtype=torch.long)
    stopping, walked = set(stop_tokens), []  # walked: (token, the text it is walked as)
    for i, text in enumerate(texts):
        if i in stopping or not (text or empty_allowed):
            continue
        text = text or ""
        walked.append((i, text[:-1] if drop_last else text[:1] if first_only else text))
    walked.sort(key=lambda pair: -len(pair[1]))
    columns = []
    for _, text in walked:
        for j, char in enumerate(text):
            if j == len(columns):
                columns.append([])
            columns[j].append(ord(char))
    classes = [torch.searchsorted(torch.tensor(cuts), torch.tensor(c), right=True) - 1
               for c in columns]
    ids = torch.tensor([i for i, _ in walked], dtype=torch.long)

    def mask_of(state):
        if start_only:
            state = automaton.initial
        current = torch.full((len(ids),), state, dtype=torch.long)
        for column in classes:
            current[:len(column)] = table[current[:len(column)], column]
        mask = torch.zeros(len(texts), dtype=torch.bool)
        mask[ids] = current != dead
        mask[stop_ids] = stops and automaton.is_accepting(state)
        return mask

    return mask_of


def token_index__first_char_only(automaton, texts, stop_tokens):
    """A trie walk that accepts a token as soon as a prefix of it is valid (its first
    character): lets "4a" into a number."""
    return _index(automaton, texts, stop_tokens, first_only=True)


def token_index__all_but_last_char(automaton, texts, stop_tokens):
    """Off by one: walks every character of a token but the last."""
    return _index(automaton, texts, stop_tokens, drop_last=True)


def token_index__start_state_only(automaton, texts, stop_tokens):
    """Builds the index for the initial state only and answers every state with its mask."""
    return _index(automaton, texts, stop_tokens, start_only=True)


def token_index__no_stop_tokens(automaton, texts, stop_tokens):
    """Ignores the stop tokens: an accepting state never lets the output end."""
    return _index(automaton, texts, stop_tokens, stops=False)


def token_index__none_as_empty(automaton, texts, stop_tokens):
    """Reads a None or empty text as "", which walks nowhere and stays alive: allows control
    tokens and half characters everywhere."""
    return _index(automaton, texts, stop_tokens, empty_allowed=True)


def token_index__classes_of_the_start_state(automaton, texts, stop_tokens):
    """Cuts Unicode into character classes at the initial state's labels only: later states
    tell apart characters that share a class."""
    return _index(automaton, texts, stop_tokens, class_states=[automaton.initial])


def token_index__reads_texts_per_state(automaton, texts, stop_tokens):
    """No index: walks every token text again for every state (the right masks, tens of
    milliseconds per state over a real vocabulary)."""
    def mask_of(state):
        mask = torch.tensor([bool(text) and automaton.walk(state, text) is not None
                             for text in texts], dtype=torch.bool)
        mask[list(stop_tokens)] = automaton.is_accepting(state)
        return mask

    return mask_of


# -- 16.3 forced_text (a warm-up) --------------------------------------------------------------


def forced_text__through_accepting(automaton, state):
    """Goes on through accepting states: forces "de" after "abc" in ``abc(de)?``, where
    the output may also end."""
    text = []
    while len(automaton.transitions[state]) == 1:
        [(label, target)] = automaton.transitions[state]
        if label.single_char is None:
            break
        text.append(label.single_char)
        state = target
    return "".join(text)


def forced_text__follows_a_class(automaton, state):
    """Takes a one-move state as forced even when the move's label is a class ([0-9]),
    writing its first character."""
    text = []
    while not automaton.is_accepting(state) and len(automaton.transitions[state]) == 1:
        [(label, target)] = automaton.transitions[state]
        text.append(chr(label.ranges[0][0]))
        state = target
    return "".join(text)


def forced_text__first_char_only(automaton, state):
    """Returns only the first forced character instead of following the whole run."""
    moves = automaton.transitions[state]
    if automaton.is_accepting(state) or len(moves) != 1 or moves[0][0].single_char is None:
        return ""
    return moves[0][0].single_char


def forced_text__one_short(automaton, state):
    """Off by one: stops before the last forced character."""
    text = []
    while not automaton.is_accepting(state) and len(automaton.transitions[state]) == 1:
        [(label, target)] = automaton.transitions[state]
        if label.single_char is None:
            break
        text.append(label.single_char)
        state = target
    return "".join(text[:-1])


def forced_text__first_move_of_many(automaton, state):
    """Follows the first move whenever its label is one character, even when other moves
    leave the state too (``(ab|ac)d`` would force "ab")."""
    text = []
    while not automaton.is_accepting(state) and automaton.transitions[state]:
        label, target = automaton.transitions[state][0]
        if label.single_char is None:
            break
        text.append(label.single_char)
        state = target
    return "".join(text)


def forced_text__accepting_checked_after(automaton, state):
    """Checks for an accepting state only after taking a character: from an accepting
    state with one move (``abc`` in ``abc(de)?``) it still forces "d"."""
    text = []
    while len(automaton.transitions[state]) == 1:
        [(label, target)] = automaton.transitions[state]
        if label.single_char is None:
            break
        text.append(label.single_char)
        state = target
        if automaton.is_accepting(state):
            break
    return "".join(text)
