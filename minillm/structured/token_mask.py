"""From a character automaton to a token mask: which of the vocabulary's tokens may come next.

The model does not write characters, it writes tokens, and one token may carry several
characters (SmolLM2's ``'":'`` or ``' Paris'``). A token is allowed in automaton state
``s`` when walking **all** its characters from ``s`` never leaves the automaton's live
states: the regex can still be completed afterwards. So the mask of a state is one walk
per vocabulary token: the readable definition, and the oracle of :mod:`.token_index`,
which the engine uses because it gives the same masks without walking the strings again.

Two kinds of tokens are special. A stop token ends the output, so it is allowed exactly
when the state is accepting (the text so far matches the whole regex): :mod:`.token_index`
applies that rule, :func:`token_mask` looks at texts only. Tokens that are not text on
their own (control tokens such as ``<|im_start|>``, and byte-level tokens holding part of
one UTF-8 character) are never allowed here: a regex over characters cannot place half a
character. (The production library works on bytes and handles them; see chapter 16.)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .regex_automaton import CharAutomaton


def token_texts(tokenizer, vocab_size: int | None = None) -> list[str | None]:
    """Each token id's text, or None for a token that is not whole text by itself (a
    control token, part of a UTF-8 character, an id past the tokenizer's vocabulary).

    ``tokenizer``: a Hugging Face tokenizer (``minillm.tokenizer.Tokenizer.hf``).
    """
    vocab_size = vocab_size or len(tokenizer)
    special = special_token_ids(tokenizer)
    pieces = tokenizer.convert_ids_to_tokens(list(range(min(vocab_size, len(tokenizer)))))
    texts: list[str | None] = [None] * vocab_size
    for token_id, piece in enumerate(pieces):
        if token_id in special or piece is None:
            continue
        text = tokenizer.convert_tokens_to_string([piece])
        if text and "\ufffd" not in text:
            texts[token_id] = text
    return texts


def special_token_ids(tokenizer) -> set[int]:
    """The control tokens (``<|im_start|>``, ``<repo_name>``, …): the tokenizer's special
    ids and every added token marked special. They are never text."""
    added = getattr(tokenizer, "added_tokens_decoder", {})
    return set(tokenizer.all_special_ids) | {i for i, t in added.items() if t.special}


def token_mask(automaton: CharAutomaton, state: int, texts: Sequence[str | None]) -> torch.Tensor:
    """bool [vocab]: True for the tokens whose every character keeps ``automaton`` alive
    when walked from ``state`` (None texts and empty strings are never allowed)."""
    allowed = [text is not None and text != "" and automaton.walk(state, text) is not None
               for text in texts]
    return torch.tensor(allowed, dtype=torch.bool)
