# Generated from solutions/ch16_structured.py by `python -m minillm.grading.exercises`.
# Fill in the parts that raise NotImplementedError; do not edit the rest.
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
    raise NotImplementedError("Exercise 16.1: The subset construction: a DFA from an NFA, with no dead states")


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
    raise NotImplementedError("Exercise 16.2: A token index: each state's mask of the whole vocabulary, fast")


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
    raise NotImplementedError("Exercise 16.3: Forced text, a warm-up: the automaton's only way forward from ``state``")
