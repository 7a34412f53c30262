"""Structured output in the engine: the compiled constraints and one matcher per sequence.

A request whose ``SamplingParams.structured`` is set gets its spec compiled once (every
later request with the same spec reuses it; ``compile_seconds`` keeps what each took) and,
per sample, a :class:`~minillm.structured.backend.Matcher` that starts at the beginning of
its output. Each step the sampler asks it to:

1. **mask** the sequence's logits rows (:meth:`StructuredOutputs.mask`): row 0 at the
   current state; with speculative guesses, row i in the state after guess i, so the
   matcher walks through the guesses (a guess the grammar forbids ends the walk: the
   target gives it probability 0, so verification rejects it there);
2. **follow** the tokens the step kept (:meth:`StructuredOutputs.follow`): take back the
   walk through the guesses, then accept the accepted ones and the new token, so a
   rejected guess leaves no trace in the automaton;
3. optionally **jump forward** (:meth:`StructuredOutputs.jump_forward`): when the grammar
   allows one continuation only (``{"name": "`` at the start of a fixed-key object), its
   tokens join the output without a forward pass each; the next step computes them all at
   once, as it computes a prompt chunk. The last token of the forced text is left to the
   model: text tokenized on its own can split differently from what follows it (the
   token-boundary problem), and the model may prefer to merge it with the next word.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from ..structured.backend import Matcher, XGrammarBackend
from ..structured.spec import StructuredOutput
from .sequence import Sequence

# (Hugging Face tokenizer, the model's vocabulary size, stop token ids) -> a backend
BackendFactory = Callable[[object, int, list[int]], object]
UNWRITABLE = ("the output constraint cannot be met: it needs text this model's vocabulary "
              "cannot write (a control character, or a code point the tokenizer has no bytes "
              "for); change the pattern, schema or choices")


class StructuredOutputs:
    def __init__(self, tokenizer, vocab_size: int, backend: BackendFactory = XGrammarBackend,
                 jump_forward: bool = False):
        """``tokenizer``: the engine's :class:`~minillm.tokenizer.Tokenizer` (or None: no
        constraints possible). ``backend`` is built on first use, so an engine that never
        sees a constrained request never loads one."""
        self.tokenizer, self.vocab_size = tokenizer, vocab_size
        self.make_backend, self.backend = backend, None
        self.jump_forward_enabled = jump_forward
        self.compiled: dict[StructuredOutput, object] = {}
        self.compile_seconds: dict[StructuredOutput, float] = {}
        self.matchers: dict[int, Matcher] = {}

    def check(self, spec: StructuredOutput) -> str | None:
        """Compile ``spec`` (once); why it cannot be used, or None."""
        if self.tokenizer is None:
            return "structured output needs the engine's tokenizer: give LLM(tokenizer=...)"
        if spec in self.compiled:
            return None
        if self.backend is None:
            self.backend = self.make_backend(self.tokenizer.hf, self.vocab_size,
                                             list(self.tokenizer.stop_tokens))
        start = time.perf_counter()
        try:
            compiled = self.backend.compile(spec)
        except ValueError as error:
            return str(error)
        if not self.allows_any(self.backend.matcher(compiled)):
            return UNWRITABLE
        self.compiled[spec] = compiled
        self.compile_seconds[spec] = time.perf_counter() - start
        return None

    def allows_any(self, matcher: Matcher) -> bool:
        """Does ``matcher`` allow some token next? (Not when the constraint needs text the
        vocabulary cannot write.)"""
        row = torch.zeros(self.vocab_size)
        matcher.mask_logits(row)
        return bool(torch.isfinite(row).any())

    def matcher(self, seq: Sequence) -> Matcher | None:
        """``seq``'s matcher (started on first use), or None if it is unconstrained."""
        spec = seq.params.structured
        if spec is None:
            return None
        if seq.id not in self.matchers:
            if (error := self.check(spec)) is not None:
                raise ValueError(error)
            self.matchers[seq.id] = self.backend.matcher(self.compiled[spec])
        return self.matchers[seq.id]

    def mask(self, seq: Sequence, guesses: tuple[int, ...], logits: torch.Tensor) -> int:
        """Mask ``seq``'s rows [1 + guesses, vocab] in place; returns how many of its
        ``guesses`` the matcher walked through (to take back in :meth:`follow`). Where
        its constraint allows no token at all, row 0 is left all -inf (:meth:`dead_end`)."""
        matcher = self.matcher(seq)
        walked = 0
        for row, guess in zip(logits, [*guesses, None], strict=True):
            matcher.mask_logits(row)
            if guess is None or not matcher.accept(guess):
                break
            walked += 1
        return walked

    def follow(self, seq: Sequence, walked: int, tokens: list[int]) -> None:
        """Take back ``walked`` guesses and accept the step's ``tokens``."""
        matcher = self.matcher(seq)
        matcher.rollback(walked)
        for token in tokens:
            if not matcher.accept(token):
                raise RuntimeError(f"token {token} was chosen but the constraint cannot "
                                   "follow it: its mask allowed a token its automaton "
                                   "refuses")

    def jump_forward(self, seq: Sequence) -> list[int]:
        """Tokens the grammar forces next (all but the forced text's last token), accepted;
        [] when jump-forward is off or there is a choice."""
        if not self.jump_forward_enabled:
            return []
        matcher = self.matcher(seq)
        text = matcher.forced_text()
        forced = self.tokenizer.encode(text)[:-1] if text else []
        accepted = []
        for token in forced:
            if not matcher.accept(token):
                break
            accepted.append(token)
        return accepted

    def forget(self, seq: Sequence) -> None:
        self.matchers.pop(seq.id, None)
