"""Choosing the next token from logits: greedy, temperature, top-k, top-p, repetition penalty.

The pipeline for one step, on logits [batch, vocab]:

1. repetition penalty (Keskar et al. 2019, CTRL, sec. 4.1): logits of tokens already
   seen are divided by the penalty when positive and multiplied when negative;
2. temperature: logits / T; T -> 0 is greedy (argmax), T = 1 is the model's distribution;
3. top-k: keep the k most likely tokens;
4. top-p, "nucleus" (Holtzman et al. 2020, eq. 2): keep the smallest set of most likely
   tokens whose probability adds up to at least p;
5. draw from the softmax of what is left with a seeded ``torch.Generator``, so the same
   seed gives the same text. Each row of a batch may have its own generator: a request then
   draws the same tokens whatever else shares its batch.

Steps 1–4 are :func:`process_logits`; :func:`sample` adds step 5 (or the argmax).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# A seed is a signed 64-bit integer (OpenAI's `seed`); sample i of a request draws with
# seed + i, which a torch.Generator still takes (it accepts -2**63 .. 2**64 - 1).
SEED_RANGE = (-2**63, 2**63 - 1)
MAX_LOGPROBS = 20  # alternatives recorded per token, at most (OpenAI's top_logprobs limit)


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
    n: int = 1  # the engine's samples per prompt (forks sharing the prompt's KV blocks)
    logprobs: int | None = None  # the engine records each token's log-probability and the
    # top `logprobs` alternatives (None: nothing recorded)

    def __post_init__(self):
        for name in ("temperature", "top_p", "repetition_penalty"):
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

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def make_generator(self, device: torch.device | str = "cpu") -> torch.Generator:
        """A random-number generator seeded from ``seed`` (or from the global RNG if unset)."""
        generator = torch.Generator(device=device)
        if self.seed is None:
            generator.seed()
        else:
            generator.manual_seed(self.seed)
        return generator


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


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Set everything below the k-th largest logit to -inf (ties with the k-th are kept)."""
    k = min(k, logits.shape[-1])
    kth_largest = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth_largest, float("-inf"))


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probabilities sum to >= p."""
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = probs.cumsum(-1) - probs  # probability of the tokens ranked above each one
    drop_sorted = mass_before >= p  # the top token always stays (its mass_before is 0)
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def process_logits(logits: torch.Tensor, params: SamplingParams,
                   previous: torch.Tensor | None = None,
                   valid: torch.Tensor | None = None) -> torch.Tensor:
    """Steps 1–4 on ``logits`` [batch, vocab]: the logits whose softmax is sampled (filtered
    tokens at -inf). Greedy decoding only applies the penalty: its argmax is the choice."""
    logits = logits.float()
    if params.repetition_penalty != 1.0 and previous is not None and previous.numel():
        logits = apply_repetition_penalty(logits, previous, params.repetition_penalty, valid)
    if params.greedy:
        return logits
    # (logits - max) / T rather than logits / T: the same softmax, and no inf - inf = NaN
    # when T is tiny (every logit but the largest goes to -inf, the largest stays 0).
    logits = (logits - logits.max(-1, keepdim=True).values) / params.temperature
    if params.top_k:
        logits = top_k_filter(logits, params.top_k)
    if params.top_p < 1.0:
        logits = top_p_filter(logits, params.top_p)
    return logits


def sample(logits: torch.Tensor, params: SamplingParams,
           generator: torch.Generator | list[torch.Generator] | None = None,
           previous: torch.Tensor | None = None,
           valid: torch.Tensor | None = None) -> torch.Tensor:
    """Pick one token per row of ``logits`` [batch, vocab]; returns [batch] token ids.

    ``generator``: one for the batch, or a list with one per row.
    ``previous`` [batch, steps]: tokens so far, for the repetition penalty; ``valid`` marks
    which of them are real tokens (not padding).
    """
    logits = process_logits(logits, params, previous, valid)
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
