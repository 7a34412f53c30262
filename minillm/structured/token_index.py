"""A token index: every state's token mask without walking the vocabulary's strings again.

:func:`.token_mask.token_mask` walks all 49,152 token texts through the automaton, one
character at a time in Python, for every state: tens of milliseconds per state. The index
does the character work once per automaton and leaves each state a few tensor operations:

1. **Character classes.** Cut Unicode at every boundary of every label of the automaton:
   between two cuts, all characters move every state to the same next state, so one
   representative per class stands for the rest. A regex has a handful of classes where
   Unicode has a million characters.
2. **The transition table** over classes, ``table[state, class]``, with one extra *dead*
   state that every move out of the automaton goes to and never leaves.
3. **The vocabulary as class sequences**, token by token, longest first: column ``j`` holds
   the class of character ``j`` of every token longer than ``j`` (those come first).

A state's mask then walks every token at once, one column at a time: ``current =
table[current, column]``, a gather (a few milliseconds per state over SmolLM2's vocabulary,
where walking the strings takes tens). A token is allowed when it ends anywhere but the dead
state. The stop tokens follow the engine's rule: allowed exactly in accepting states.

Production libraries go further (xgrammar precomputes the tokens whose fate does not depend
on the stack; outlines-core builds every state's mask when it compiles); the idea of working
on classes and tables instead of strings is theirs too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from .charset import MAX_CODE_POINT
from .regex_automaton import CharAutomaton

MaskOf = Callable[[int], torch.Tensor]
# (automaton, token texts, stop tokens) -> the mask of each state: what the engine calls
IndexFn = Callable[[CharAutomaton, Sequence[str | None], Sequence[int]], MaskOf]


class TokenIndex:
    """Token masks of one automaton over one vocabulary (``texts`` as given by
    :func:`.token_mask.token_texts`: None for a token that is not text of its own).

    The arrays are numpy's: a state's mask is about a hundred small gathers (one per
    character position), and numpy's per-call overhead is a fraction of torch's.
    """

    def __init__(self, automaton: CharAutomaton, texts: Sequence[str | None],
                 stop_tokens: Sequence[int]):
        self.automaton, self.vocab_size = automaton, len(texts)
        self.stop_tokens = sorted(set(stop_tokens))
        stops = set(stop_tokens)
        ids = sorted((i for i, text in enumerate(texts) if text and i not in stops),
                     key=lambda i: -len(texts[i]))
        self.ids = np.array(ids, dtype=np.int64)
        cuts = sorted({0} | {point for moves in automaton.transitions for label, _ in moves
                             for lo, hi in label.ranges for point in (lo, hi + 1)
                             if point <= MAX_CODE_POINT})
        self.dead, self.num_classes = automaton.num_states, len(cuts)
        rows = [[self.dead if (nxt := automaton.step(state, chr(cut))) is None else nxt
                 for cut in cuts] for state in range(automaton.num_states)]
        # flat: the next state of (state, class) is table[state * num_classes + class]
        self.table = np.array(rows + [[self.dead] * len(cuts)], dtype=np.int64).ravel()
        self.columns = self._columns([texts[i] for i in ids], np.array(cuts))

    @staticmethod
    def _columns(texts: list[str], cuts: np.ndarray) -> list[np.ndarray]:
        """Column j: the class of character j of each text longer than j (``texts`` sorted
        longest first, so those are the first ones). All texts' code points are read at
        once, as UTF-32."""
        if not texts:
            return []
        lengths = np.array([len(text) for text in texts])
        codes = np.frombuffer("".join(texts).encode("utf-32-le", "surrogatepass"),
                              dtype=np.uint32)
        classes = np.searchsorted(cuts, codes, side="right") - 1
        starts = np.cumsum(lengths) - lengths
        counts = [int((lengths > j).sum()) for j in range(int(lengths[0]))]
        return [classes[starts[:count] + j] for j, count in enumerate(counts)]

    def mask(self, state: int) -> torch.Tensor:
        """bool [vocab]: the tokens allowed in ``state`` (the stop tokens when it accepts)."""
        current = np.full(len(self.ids), state, dtype=np.int64)
        for column in self.columns:
            walking = current[:len(column)]
            walking[:] = self.table[walking * self.num_classes + column]
        mask = np.zeros(self.vocab_size, dtype=bool)
        mask[self.ids] = current != self.dead
        mask[self.stop_tokens] = self.automaton.is_accepting(state)
        return torch.from_numpy(mask)


def token_index(automaton: CharAutomaton, texts: Sequence[str | None],
                stop_tokens: Sequence[int]) -> MaskOf:
    """The engine's :data:`IndexFn`: the mask function of a :class:`TokenIndex`."""
    return TokenIndex(automaton, texts, stop_tokens).mask
