"""Choosing the next token from logits: greedy, temperature, top-k, top-p, min-p, logit
bias and penalties on repetition.

The pipeline for one step, on logits l [batch, vocab] (each option as OpenAI's and vLLM's
APIs define it; its default leaves the logits as they are):

1. logit bias (OpenAI's ``logit_bias``): l_j <- l_j + b_j for the tokens j given a bias
   b_j in [-100, 100]; -100 all but bans a token, +100 all but forces it;
2. repetition penalty θ (Keskar et al. 2019, CTRL, sec. 4.1): logits of tokens already
   seen, in the prompt or the output, are divided by θ when positive and multiplied by θ
   when negative;
3. presence and frequency penalties (OpenAI's; vLLM's): with c_j the number of times
   token j appears in the tokens generated so far (the output, not the prompt),
   l_j <- l_j - c_j·α_frequency - 1[c_j > 0]·α_presence, each α in [-2, 2]; positive
   values discourage repetition, negative ones encourage it.
   Greedy decoding stops here: its choice is the argmax, which the steps below never change;
4. temperature: logits / T; T -> 0 is greedy (argmax), T = 1 is the model's distribution;
5. min-p (Nguyen et al. 2024, "Turning Up the Heat: Min-p Sampling"): with
   p = softmax(l / T), drop the tokens with p_j < min_p · max_i p_i, so the cut follows
   how confident the model is;
6. top-k: keep the k most likely tokens;
7. top-p, "nucleus" (Holtzman et al. 2020, eq. 2): keep the smallest set of most likely
   tokens whose probability adds up to at least p;
8. draw from the softmax of what is left with a seeded ``torch.Generator``, so the same
   seed gives the same text. Each row of a batch may have its own generator: a request then
   draws the same tokens whatever else shares its batch.

Steps 1–7 are :func:`process_logits`; :func:`sample` adds step 8 (or the argmax). A
request's ``structured`` output (:mod:`minillm.structured`) is not a step here: the
serving engine enforces it.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import get_args

import torch

from .structured.spec import StructuredOutput

# A seed is a signed 64-bit integer (OpenAI's `seed`); sample i of a request draws with
# seed + i, wrapped around into the same range (:func:`sample_seed`).
SEED_RANGE = (-2**63, 2**63 - 1)
MAX_LOGPROBS = 20  # alternatives recorded per token, at most (OpenAI's top_logprobs limit)
MAX_LOGIT_BIAS = 100  # |b_j| <= 100 (OpenAI's range)
MAX_PENALTY = 2  # |α_presence|, |α_frequency| <= 2 (OpenAI's range)


def sample_seed(seed: int, index: int) -> int:
    """The seed of sample ``index`` of a request seeded with ``seed``: seed + index,
    wrapped around within :data:`SEED_RANGE` (so a request for n samples seeded near the
    top of the range is served, each sample still equal to a lone request with its seed)."""
    low, high = SEED_RANGE
    return (seed + index - low) % (high - low + 1) + low


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens. The defaults are greedy decoding."""

    temperature: float = 0.0  # 0 means greedy
    top_k: int = 0  # 0 means no top-k filter
    top_p: float = 1.0  # 1.0 means no nucleus filter
    repetition_penalty: float = 1.0  # 1.0 means no penalty
    seed: int | None = None
    max_tokens: int = 16  # the serving engine's limit per request (generate() has its own)
    stop_token_ids: tuple[int, ...] = ()  # the engine also stops on these
    stop: tuple[str, ...] = ()  # the output ends before the first of these strings (a str or
    # a list is accepted); the output processor finds them, across tokens
    include_stop_str_in_output: bool = False  # ... or ends after it, keeping it (vLLM's)
    n: int = 1  # the engine's samples per prompt (forks sharing the prompt's KV blocks)
    logprobs: int | None = None  # the engine records each token's log-probability and the
    # top `logprobs` alternatives (None: nothing recorded)
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token, bias) pairs; a dict is accepted
    presence_penalty: float = 0.0  # 0 means no penalty
    frequency_penalty: float = 0.0  # 0 means no penalty
    min_p: float = 0.0  # 0 means no min-p filter
    structured: StructuredOutput | None = None  # the engine constrains the output to it

    def __post_init__(self):
        # sorted pairs whatever was given, so equal biases give equal (and hashable) params
        object.__setattr__(self, "logit_bias", _logit_bias_pairs(self.logit_bias))
        stops = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        if not all(isinstance(stop, str) and stop for stop in stops):
            raise ValueError(f"stop must be a string or a list of non-empty strings, got "
                             f"{self.stop!r}")
        object.__setattr__(self, "stop", stops)
        for name in ("temperature", "top_p", "repetition_penalty", "presence_penalty",
                     "frequency_penalty", "min_p"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be a finite number, got {getattr(self, name)}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 is greedy), got {self.temperature}")
        if self.seed is not None and not SEED_RANGE[0] <= self.seed <= SEED_RANGE[1]:
            raise ValueError(f"seed must be a 64-bit integer ({SEED_RANGE[0]} to "
                             f"{SEED_RANGE[1]}), got {self.seed}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (1 disables it), got {self.top_p}")
        if self.top_k < 0 or int(self.top_k) != self.top_k:
            raise ValueError(f"top_k must be a whole number >= 0 (0 disables it), got {self.top_k}")
        if self.repetition_penalty <= 0:
            raise ValueError(
                f"repetition_penalty must be > 0 (1 disables it), got {self.repetition_penalty}")
        if self.max_tokens < 1 or int(self.max_tokens) != self.max_tokens:
            raise ValueError(f"max_tokens must be a whole number >= 1, got {self.max_tokens}")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise ValueError(f"logprobs must be between 0 and {MAX_LOGPROBS}, got {self.logprobs}")
        if self.n < 1 or int(self.n) != self.n:
            raise ValueError(f"n (samples per prompt) must be a whole number >= 1, got {self.n}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -MAX_PENALTY <= getattr(self, name) <= MAX_PENALTY:
                raise ValueError(f"{name} must be in [-{MAX_PENALTY}, {MAX_PENALTY}] (0 disables "
                                 f"it), got {getattr(self, name)}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1] (0 disables it), got {self.min_p}")
        if self.structured is not None and not isinstance(self.structured, StructuredOutput):
            kinds = ", ".join(kind.__name__ for kind in get_args(StructuredOutput))
            raise ValueError(f"structured must be None or one of minillm.structured.spec's "
                             f"{kinds}; got {type(self.structured).__name__}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def uses_history(self) -> bool:
        """Whether the next token's distribution depends on the tokens before it (a
        repetition, presence or frequency penalty)."""
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0)

    @property
    def plain_greedy(self) -> bool:
        """Greedy with nothing that moves the argmax: the token is the raw logits' argmax.
        (Min-p, top-k and top-p always keep the top token; ``structured`` is the engine's.)"""
        return self.greedy and not self.uses_history and not self.logit_bias

    def make_generator(self, device: torch.device | str = "cpu") -> torch.Generator:
        """A random-number generator seeded from ``seed`` (or from the global RNG if unset)."""
        generator = torch.Generator(device=device)
        if self.seed is None:
            generator.seed()
        else:
            generator.manual_seed(self.seed)
        return generator


def _logit_bias_pairs(logit_bias: Mapping[int, float] | Iterable[tuple[int, float]]
                      ) -> tuple[tuple[int, float], ...]:
    """``logit_bias`` (a dict {token: bias} or (token, bias) pairs) as sorted (int, float)
    pairs, each checked: token ids whole numbers >= 0, biases finite and in [-100, 100]."""
    items = logit_bias.items() if isinstance(logit_bias, Mapping) else logit_bias
    try:
        pairs = [(token, bias) for token, bias in items]
    except (TypeError, ValueError):
        raise ValueError("logit_bias must be a dict {token_id: bias} or (token_id, bias) "
                         f"pairs, got {logit_bias!r}") from None
    for token, bias in pairs:
        if isinstance(token, bool) or not isinstance(token, numbers.Integral) or token < 0:
            raise ValueError(f"logit_bias token ids must be whole numbers >= 0, got {token!r} "
                             "(convert JSON's string keys with int())")
        if not isinstance(bias, numbers.Real) or not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
            raise ValueError(f"logit_bias for token {token} must be a finite number in "
                             f"[-{MAX_LOGIT_BIAS}, {MAX_LOGIT_BIAS}], got {bias!r}")
    tokens = [token for token, _ in pairs]
    if len(set(tokens)) != len(tokens):
        raise ValueError(f"logit_bias gives a token more than one bias: {sorted(tokens)}; "
                         "give each token one bias (their sum, if you meant to add them)")
    return tuple(sorted((int(token), float(bias)) for token, bias in pairs))


def apply_logit_bias(logits: torch.Tensor, logit_bias: tuple[tuple[int, float], ...]
                     ) -> torch.Tensor:
    """Add b_j to the logit of each token j of ``logit_bias`` ((j, b_j) pairs, one per
    token): l_j <- l_j + b_j."""
    vocab, largest = logits.shape[-1], max(token for token, _ in logit_bias)
    if largest >= vocab:
        raise ValueError(f"logit_bias names token {largest}, but the vocabulary has {vocab} "
                         f"tokens (ids 0 to {vocab - 1}); drop it")
    tokens = torch.tensor([token for token, _ in logit_bias], device=logits.device)
    biases = torch.tensor([bias for _, bias in logit_bias], dtype=logits.dtype,
                          device=logits.device)
    return logits.index_add(-1, tokens, biases.expand(*logits.shape[:-1], -1))


def apply_repetition_penalty(logits: torch.Tensor, previous: torch.Tensor, penalty: float,
                             valid: torch.Tensor | None = None) -> torch.Tensor:
    """Make tokens in ``previous`` [batch, steps] less likely by ``penalty`` (CTRL's rule).

    ``valid`` [batch, steps] marks the real tokens of ``previous`` (False for padding): a
    padding id is not a token the sequence has seen.
    """
    counts = torch.zeros(logits.shape, dtype=torch.int32, device=logits.device)
    ones = torch.ones_like(previous, dtype=torch.int32) if valid is None else valid.int()
    seen = counts.scatter_add_(-1, previous, ones) > 0
    return torch.where(seen, torch.where(logits > 0, logits / penalty, logits * penalty), logits)


def apply_presence_frequency_penalties(logits: torch.Tensor, output: torch.Tensor,
                                       presence: float, frequency: float) -> torch.Tensor:
    """OpenAI's penalties on the tokens generated so far, ``output`` [batch, steps]: with c_j
    the count of token j in its row, l_j <- l_j - c_j·frequency - 1[c_j > 0]·presence."""
    ones = torch.ones(output.shape, dtype=logits.dtype, device=logits.device)
    counts = torch.zeros_like(logits).scatter_add_(-1, output.to(logits.device), ones)
    return logits - counts * frequency - (counts > 0).to(logits.dtype) * presence


def min_p_filter(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Set to -inf the tokens whose probability is below ``min_p`` times the top token's:
    p_j < min_p · max_i p_i, with p = softmax(logits). The top token always stays."""
    probs = torch.softmax(logits, dim=-1)
    threshold = min_p * probs.max(dim=-1, keepdim=True).values
    return logits.masked_fill(probs < threshold, float("-inf"))


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Set everything below the k-th largest logit to -inf (ties with the k-th are kept)."""
    k = min(k, logits.shape[-1])
    kth_largest = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth_largest, float("-inf"))


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probabilities sum to >= p.

    The most likely token always stays, for any p in (0, 1]; p = 1 keeps every token.
    """
    if p >= 1:  # the cumulative sum may round to 1 before the last tokens: keep them all
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = probs.cumsum(-1) - probs  # probability of the tokens ranked above each one
    drop_sorted = mass_before >= p
    # the top token's mass_before is 0, but a tiny p (1e-300) is 0 too in float32: keep it
    drop_sorted[..., 0] = False
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def process_logits(logits: torch.Tensor, params: SamplingParams,
                   previous: torch.Tensor | None = None,
                   valid: torch.Tensor | None = None, *,
                   output: torch.Tensor | None = None) -> torch.Tensor:
    """Steps 1–7 on ``logits`` [batch, vocab]: the logits whose softmax is sampled (filtered
    tokens at -inf). Greedy decoding only applies the bias and the penalties: its argmax is
    the choice. ``previous``, ``valid`` and ``output``: see :func:`sample`."""
    logits = logits.float()
    if params.logit_bias:
        logits = apply_logit_bias(logits, params.logit_bias)
    if params.repetition_penalty != 1.0 and previous is not None and previous.numel():
        logits = apply_repetition_penalty(logits, previous, params.repetition_penalty, valid)
    if (params.presence_penalty or params.frequency_penalty) and output is not None \
            and output.numel():
        logits = apply_presence_frequency_penalties(
            logits, output, params.presence_penalty, params.frequency_penalty)
    if params.greedy:
        return logits
    # (logits - max) / T rather than logits / T: the same softmax, and no inf - inf = NaN
    # when T is tiny (every logit but the largest goes to -inf, the largest stays 0).
    logits = (logits - logits.max(-1, keepdim=True).values) / params.temperature
    if params.min_p:
        logits = min_p_filter(logits, params.min_p)
    if params.top_k:
        logits = top_k_filter(logits, params.top_k)
    if params.top_p < 1.0:
        logits = top_p_filter(logits, params.top_p)
    return logits


def sample(logits: torch.Tensor, params: SamplingParams,
           generator: torch.Generator | list[torch.Generator] | None = None,
           previous: torch.Tensor | None = None,
           valid: torch.Tensor | None = None, *,
           output: torch.Tensor | None = None) -> torch.Tensor:
    """Pick one token per row of ``logits`` [batch, vocab]; returns [batch] token ids.

    ``generator``: one for the batch, or a list with one per row.
    ``previous`` [batch, steps]: tokens so far (prompt and output), for the repetition
    penalty; ``valid`` marks which of them are real tokens (not padding).
    ``output`` [batch, steps]: the tokens generated so far, for the presence and frequency
    penalties (without it, or empty, they do nothing: the first token has no history).
    """
    logits = process_logits(logits, params, previous, valid, output=output)
    if params.greedy:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits, dim=-1)
    if not isinstance(generator, list):
        return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)
    return torch.cat([torch.multinomial(row, num_samples=1, generator=g)
                      for row, g in zip(probs, generator, strict=True)])


@dataclass(frozen=True)
class TokenLogprob:
    """A chosen token's log-probability under the model, and the most likely alternatives
    (token id, log-probability), best first."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]


def token_logprob(logits: torch.Tensor, token: int, top: int) -> TokenLogprob:
    """``token``'s log-probability in the model's own distribution (log-softmax of the raw
    ``logits`` [vocab], before temperature or filters), with the ``top`` best tokens."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    best = torch.topk(logprobs, top) if top else None
    alternatives = () if best is None else tuple(
        (int(i), float(v)) for v, i in zip(best.values, best.indices, strict=True))
    return TokenLogprob(int(token), float(logprobs[token]), alternatives)
