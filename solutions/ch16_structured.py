"""Chapter 16: structured output — from a regex's character automaton to the token mask that
constrains a model's next token, and the text a grammar forces, which jump-forward decoding
appends without running the model."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from minillm.structured.regex_automaton import CharAutomaton


def token_mask(automaton: CharAutomaton, state: int,
               texts: Sequence[str | None]) -> torch.Tensor:
    """Exercise 16.1: The token mask of one automaton state: which tokens may come next.

    ``automaton`` is a regex's deterministic automaton over *characters*
    (:func:`minillm.structured.regex_automaton.compile_regex`): ``automaton.step(state,
    char)`` is the state after one character, and ``automaton.walk(state, text)`` the state
    after every character of ``text`` in turn, or None as soon as one leads nowhere. The
    automaton keeps only live states (states from which the regex can still be completed),
    so None means "dead": no continuation of that text can match any more.

    The model does not write characters, it writes tokens, and one token can carry several
    characters (SmolLM2's ``' 42'``, ``'":'`` or ``' Paris'``). ``texts[i]`` is token
    ``i``'s text (:func:`minillm.structured.token_mask.token_texts`), or None for a token
    that is not text on its own (a control token such as ``<|im_start|>``, part of a UTF-8
    character, an id past the tokenizer's vocabulary).

    Returns a bool tensor of ``len(texts)`` entries, True for token ``i`` when:

    * ``texts[i]`` is not None and not empty (an empty token would let the model stall
      forever without moving the automaton), and
    * walking **all** its characters from ``state`` keeps the automaton alive:
      ``automaton.walk(state, texts[i]) is not None``. Checking only the first character
      would let ``'1a'`` into a number; the end need not be accepting: ``'-'`` may start
      ``-42`` even though ``-`` alone is no number.

    Stop tokens are not this function's business: the engine allows them exactly when
    ``state`` is accepting (:class:`minillm.structured.backend.AutomatonBackend`). The
    engine calls this once per state and keeps the result: the same state comes back at
    every digit of a number.
    """
    ### BEGIN SOLUTION
    allowed = [text is not None and text != "" and automaton.walk(state, text) is not None
               for text in texts]
    return torch.tensor(allowed, dtype=torch.bool)
    ### END SOLUTION


def forced_text(automaton: CharAutomaton, state: int) -> str:
    """Exercise 16.2: The text the automaton forces from ``state``: its only way forward.

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
