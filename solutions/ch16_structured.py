"""Chapter 16: structured output. The lab (exercises 16.1 and 16.2) is the course's regex
compiler and token mask: the subset construction that turns a regex's NFA into a DFA, and a
token index that gives any state's mask of the whole vocabulary without walking the token
strings again. The engine runs both (:func:`your_backend`). Exercise 16.3, a warm-up, is the
text a grammar forces, which jump-forward decoding appends without running the model."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from minillm.structured.backend import AutomatonBackend
from minillm.structured.charset import MAX_CODE_POINT, CharSet
from minillm.structured.nfa import NFA
from minillm.structured.regex_automaton import CharAutomaton, thompson_nfa


def determinize(nfa: NFA, start: int, end: int) -> CharAutomaton:
    r"""Exercise 16.1: The subset construction: a DFA from an NFA, with no dead states.

    **Input.** An NFA built by Thompson's construction (:class:`minillm.structured.nfa.NFA`,
    from :func:`minillm.structured.regex_automaton.thompson_nfa`), and its ``start`` and
    ``end`` states. NFA states are the ints ``0 .. len(nfa.moves) - 1``:

    * ``nfa.moves[s]``: the moves reading one character, ``(label, target)`` pairs; a label
      is a :class:`~minillm.structured.charset.CharSet`, a set of Unicode code points kept
      as sorted, disjoint inclusive ranges ``label.ranges``. Labels leaving one NFA state
      (or a set of them) may overlap: ``[a-z]`` and ``a`` both read "a".
    * ``nfa.epsilon[s]``: the states reachable from ``s`` without reading anything;
      ``nfa.closure(states)`` is every state reachable from ``states`` by such ε-moves
      (``states`` included), as a frozenset.

    A text is *accepted* when reading it can lead from ``start`` to ``end`` (ε-moves in
    between are free).

    **Output.** A :class:`~minillm.structured.regex_automaton.CharAutomaton`
    ``CharAutomaton(initial, accepting, transitions)`` over the same texts:

    * a DFA state stands for a *set* of NFA states: all the states some text could have led
      the NFA to. ``transitions[q]`` lists the moves of state ``q`` as ``(CharSet,
      next_state)`` pairs; ``accepting`` is the frozenset of states whose text may end there;
      states are ``0 .. len(transitions) - 1``.
    * **deterministic**: the labels leaving one state are non-empty and pairwise disjoint,
      so each character has at most one next state;
    * **no dead states**: every state is reachable from ``initial`` and can reach an
      accepting state. A character with no move means "no continuation can match any
      more", and ``automaton.walk`` returns None as soon as that happens. A pattern that
      matches nothing at all (``[^\s\S]``) is one state, not accepting, with no moves.
    * accepts exactly the NFA's texts. It need not be minimal: the engine only reads moves.

    **What the engine calls.** ``CharAutomaton.walk`` and ``step`` after each token, and
    your index (exercise 16.2) over this automaton (:func:`your_backend`).

    Hints: Rabin & Scott (1959), the subset construction; the notebook's section 2. The
    alphabet is all of Unicode: work with the ranges' boundaries, never one character at a
    time. ``minillm/structured/dfa.py`` is the library's version (read it after yours).
    """
    ### BEGIN SOLUTION
    def pieces(moves) -> dict[frozenset[int], list[tuple[int, int]]]:
        """The labels' characters cut at every range boundary: per set of NFA targets, the
        ranges of characters that lead to exactly those targets. A sweep in code-point
        order: at each boundary one move's label starts or stops reading."""
        events = sorted((point, i) for i, (label, _) in enumerate(moves)
                        for lo, hi in label.ranges for point in (lo, hi + 1))
        reading: set[int] = set()  # the moves whose label holds the current characters
        by_targets: dict[frozenset[int], list[tuple[int, int]]] = {}
        for (point, i), (following, _) in zip(events, events[1:], strict=False):
            reading ^= {i}
            if reading and following > point:
                targets = frozenset(moves[j][1] for j in reading)
                by_targets.setdefault(targets, []).append((point, following - 1))
        return by_targets

    subsets = [nfa.closure([start])]
    number, closed = {subsets[0]: 0}, {}
    moves_of: list[dict[int, list[tuple[int, int]]]] = []
    for subset in subsets:  # grows while new subsets turn up
        ranges: dict[int, list[tuple[int, int]]] = {}
        for targets, chars in pieces([m for s in subset for m in nfa.moves[s]]).items():
            if targets not in closed:  # the same targets come back from many subsets
                closed[targets] = nfa.closure(targets)
            following = closed[targets]
            if following not in number:
                number[following] = len(subsets)
                subsets.append(following)
            ranges.setdefault(number[following], []).extend(chars)
        moves_of.append(ranges)
    live = {q for q, subset in enumerate(subsets) if end in subset}
    grew = True
    while grew:  # live: the states that can reach an accepting one
        grew = False
        for q, ranges in enumerate(moves_of):
            if q not in live and any(target in live for target in ranges):
                live.add(q)
                grew = True
    if 0 not in live:
        return CharAutomaton(0, frozenset(), ((),))
    new = {q: i for i, q in enumerate(sorted(live))}  # 0 stays 0
    transitions = tuple(tuple((CharSet(tuple(r)), new[t]) for t, r in moves_of[q].items()
                              if t in live) for q in sorted(live))
    accepting = frozenset(new[q] for q in live if end in subsets[q])
    return CharAutomaton(0, accepting, transitions)
    ### END SOLUTION


def token_index(automaton: CharAutomaton, texts: Sequence[str | None],
                stop_tokens: Sequence[int]) -> Callable[[int], torch.Tensor]:
    """Exercise 16.2: A token index: each state's mask of the whole vocabulary, fast.

    **Input.** A regex's DFA over characters (the library's, or yours from exercise 16.1):
    ``automaton.transitions[q]`` its ``(CharSet, next_state)`` moves, ``automaton.step(q,
    char)`` and ``automaton.walk(q, text)`` the state after a character or a text (None as
    soon as no match can follow), ``automaton.is_accepting(q)``. Every state of it is live.
    ``texts[i]`` is token ``i``'s text (:func:`minillm.structured.token_mask.token_texts`),
    or None for a token that is not text on its own (a control token, part of a UTF-8
    character). ``stop_tokens``: the ids that end the output.

    **Output.** A function ``mask_of(state)`` -> bool tensor of ``len(texts)`` entries,
    for any state of ``automaton``:

    * a stop token is allowed exactly when ``state`` is accepting (whatever its text);
    * any other token ``i`` is allowed when ``texts[i]`` is a non-empty string and walking
      **all** its characters from ``state`` keeps the automaton alive
      (``automaton.walk(state, texts[i]) is not None``). It need not end accepting: "-"
      may start "-42". A None or empty text is never allowed.

    These are exactly the masks of the library's readable definition,
    :func:`minillm.structured.token_mask.token_mask` with the stop rule, which walks every
    token string through the automaton again for every state (tens of milliseconds in
    Python over 49,152 tokens). **The index is built once per automaton, here, and
    ``mask_of`` must not read ``texts`` again**: the graded tests give you a vocabulary
    that refuses to be read once this function has returned. The engine calls
    ``token_index`` when it compiles a regex and ``mask_of`` once per state it meets
    (:class:`minillm.structured.backend.AutomatonBackend`); the notebook times it against
    the definition and xgrammar.

    Hints: two known designs. A *token trie* (one path per token text) walked together with
    the automaton visits each shared prefix once and stops where the automaton dies
    (llguidance walks one; Outlines, Willard & Louf 2023, precomputes every state's
    tokens). Or compile the vocabulary for this automaton: the labels' range boundaries cut
    Unicode into a few *character classes* that every state treats alike, the automaton
    becomes a table ``[state, class]``, and every token a sequence of classes, so a state's
    mask is a few tensor gathers. Notebook section 4.
    """
    ### BEGIN SOLUTION
    # Character classes: Unicode cut at every label boundary; cuts[k] stands for class k.
    cuts = sorted({0} | {p for moves in automaton.transitions for label, _ in moves
                         for lo, hi in label.ranges for p in (lo, hi + 1) if p <= MAX_CODE_POINT})
    dead, width = automaton.num_states, len(cuts)  # one extra state: dead, and it stays dead
    rows = [[dead if (nxt := automaton.step(q, chr(cut))) is None else nxt for cut in cuts]
            for q in range(automaton.num_states)]
    table = np.array(rows + [[dead] * width]).ravel()  # next state: table[q * width + class]
    stops = sorted(set(stop_tokens))
    ids = sorted((i for i, text in enumerate(texts) if text and i not in stops),
                 key=lambda i: -len(texts[i]))  # longest first
    columns: list[list[int]] = []  # columns[j]: code point j of each token longer than j
    for i in ids:
        for j, char in enumerate(texts[i]):
            if j == len(columns):
                columns.append([])
            columns[j].append(ord(char))
    classes = [np.searchsorted(cuts, column, side="right") - 1 for column in columns]
    ids_array, size = np.array(ids, dtype=np.int64), len(texts)

    def mask_of(state: int) -> torch.Tensor:
        current = np.full(len(ids), state)
        for column in classes:  # the tokens still walking are the first len(column)
            current[:len(column)] = table[current[:len(column)] * width + column]
        mask = np.zeros(size, dtype=bool)
        mask[ids_array] = current != dead
        mask[stops] = automaton.is_accepting(state)
        return torch.from_numpy(mask)

    return mask_of
    ### END SOLUTION


def your_regex_compiler(pattern: str) -> CharAutomaton:
    """``pattern``'s DFA through your subset construction (exercise 16.1): the library
    parses the pattern and builds its NFA (Thompson's construction), you determinize it."""
    return determinize(*thompson_nfa(pattern))


def your_backend(tokenizer, vocab_size: int, stop_tokens: list[int]) -> AutomatonBackend:
    """The course's automaton backend with your compiler and your index (exercises 16.1
    and 16.2): ``LLM(model, structured_backend=impl.your_backend)``."""
    return AutomatonBackend(tokenizer, vocab_size, stop_tokens,
                            compile_fn=your_regex_compiler, index_fn=token_index)


def forced_text(automaton: CharAutomaton, state: int) -> str:
    """Exercise 16.3: Forced text, a warm-up: the automaton's only way forward from ``state``.

    Jump-forward decoding: after ``{"name": "Ada", `` the schema of a fixed-key object
    allows exactly one continuation, ``"age": ``, and running the model once per token to
    "choose" it is wasted work. The engine appends such forced text at once and lets the
    next forward pass compute its tokens together, as it computes a prompt.

    ``automaton.transitions[s]`` lists the moves out of state ``s``: ``(label, target)``
    pairs, where ``label`` is a :class:`~minillm.structured.regex_automaton.CharSet` (a set
    of characters; ``label.single_char`` is its one character if it has exactly one, else
    None) and ``target`` the next state. ``automaton.is_accepting(s)`` says whether the
    text read so far may end at ``s``.

    A character is forced in state ``s`` when **all** of these hold:

    * ``s`` is not accepting (there, stopping is a choice too: the model may end the
      output or go on);
    * exactly one move leaves ``s``;
    * that move's label is a single character (``[0-9]`` is one move but ten choices).

    Append it, move to the target state, and repeat until a state has a choice. Return the
    characters collected ("" when ``state`` itself has a choice). The loop ends: a cycle
    of forced, non-accepting states could never reach an accepting one, and
    :func:`~minillm.structured.regex_automaton.compile_regex` has removed such dead states.
    Example: for ``ab(c|d)`` from the start, ``"ab"``; for ``(yes|no)``, ``""``.
    """
    ### BEGIN SOLUTION
    text = []
    while not automaton.is_accepting(state) and len(automaton.transitions[state]) == 1:
        [(label, target)] = automaton.transitions[state]
        if label.single_char is None:
            break
        text.append(label.single_char)
        state = target
    return "".join(text)
    ### END SOLUTION
