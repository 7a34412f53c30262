"""``speculative_generate``: the engine with speculative decoding, for one request.

    tokens, stats = speculative_generate(target, PromptLookup(), prompt, 64, gamma=4)
    tokens, stats = speculative_generate(target, DraftModel(draft), prompt, 64, gamma=4)

A client of :class:`~minillm.serve.LLM` with ``SchedulerConfig(speculative_tokens=γ)``:
the guesses come from prompt lookup (:class:`~minillm.speculative.PromptLookup`) or a
draft model (:class:`DraftModel`, run inside the engine with its own paged cache:
:mod:`minillm.engine.proposers`), and the engine's sampler checks them
(:func:`~minillm.speculative.check_drafts`). The math is :mod:`minillm.speculative`.

Its pool has room for the prompt, every new token and γ guesses, and the scheduler gives
guesses whatever the planned work leaves, so every target pass after the prompt carries
guesses (until ``max_new_tokens`` leaves no room for one): ``tokens_per_call`` measures
the method, not the bookkeeping.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from .model import Transformer
from .reference import check_request
from .sampling import SamplingParams
from .serve import LLM, SchedulerConfig
from .speculative import PromptLookup, lookup_ngram


@dataclass(frozen=True)
class DraftModel:
    """A smaller model as the draft (it must share the target's tokenizer): it guesses
    with the request's own sampling parameters, inside the engine
    (:mod:`minillm.engine.proposers`)."""

    model: Transformer


@dataclass
class SpeculativeStats:
    """The target's passes after the prompt (each checks that step's guesses), the guesses
    made and accepted, and the tokens those passes gave (every pass gives the accepted
    guesses plus one: ``tokens_per_call`` is 1 without speculation)."""

    target_calls: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    accepted_per_call: list[int] = field(default_factory=list)
    drafted_per_call: list[int] = field(default_factory=list)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_call(self) -> float:
        return self.emitted / self.target_calls if self.target_calls else 0.0


def speculative_generate(target: Transformer, proposer: DraftModel | PromptLookup,
                         prompt: Sequence[int], max_new_tokens: int,
                         params: SamplingParams = SamplingParams(), *, gamma: int = 4,
                         stop_tokens: Sequence[int] = (),
                         verifier=None) -> tuple[list[int], SpeculativeStats]:
    """Generate up to ``max_new_tokens`` after ``prompt`` with ``proposer`` guessing up to
    ``gamma`` tokens per target pass. Returns the new tokens (as plain sampling from the
    target would distribute them; greedy: the very same tokens) and the acceptance
    statistics of the target's passes after the prompt. Greedy requests are verified by
    comparing tokens, sampled ones by rejection sampling
    (:func:`~minillm.speculative.verify`). A ``verifier`` with ``verify``'s signature
    replaces both (greedy then goes through one-hot distributions; chapter 11 passes the
    learner's)."""
    if params.uses_history:
        raise ValueError("speculative decoding here supports temperature, top-k, top-p, "
                         "min-p and logit_bias; a repetition penalty (or a presence or "
                         "frequency penalty) makes p depend on the draft's tokens")
    if gamma < 1:
        raise ValueError(f"gamma must be at least 1, got {gamma}")
    tokens = [int(t) for t in prompt]
    check_request(target, [tokens], max_new_tokens, 0)
    drafter = proposer.drafter if isinstance(proposer, PromptLookup) else lookup_ngram
    draft_model = proposer.model if isinstance(proposer, DraftModel) else None
    llm = LLM(target, block_size=16, num_blocks=-(-(len(tokens) + max_new_tokens + gamma) // 16),
              prefix_caching=False, draft_model=draft_model, verifier=verifier,
              scheduler=SchedulerConfig(max_batch=1, speculative_tokens=gamma, drafter=drafter))
    request = llm.add_request(tokens, replace(params, max_tokens=max_new_tokens,
                                              stop_token_ids=tuple(stop_tokens)))
    sample = llm.outputs[request].outputs[0]
    stats = SpeculativeStats()
    while llm.has_work:
        verifying, drafted, accepted = bool(sample.tokens), sample.drafted, sample.accepted
        llm.step()
        if verifying:  # a pass after the prompt: it checked this step's guesses
            stats.target_calls += 1
            stats.drafted_per_call.append(sample.drafted - drafted)
            stats.accepted_per_call.append(sample.accepted - accepted)
    output = llm.output(request)
    if output.error is not None:
        raise RuntimeError(output.error)
    stats.drafted, stats.accepted = sample.drafted, sample.accepted
    stats.emitted = len(sample.tokens) - 1  # the first token came from the prompt's pass
    return list(sample.tokens), stats
