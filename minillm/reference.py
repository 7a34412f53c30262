"""The course's reference decoding loop: feed the model its own output, one token at a time.

This is the loop chapters 01–04 build and read: dense tensors, a contiguous KV cache, left
padding for batches. It is the test oracle every faster path is compared with, not a
product path: :func:`minillm.generate.generate` runs the serving engine
(:mod:`minillm.serve`), which computes the same tokens.

Two loops compute the same tokens:

* **no cache**: every step runs the model over the whole sequence so far. Step t costs
  O(t) token computations (and O(t²) attention), so n tokens cost O(n²).
* **KV cache**: one *prefill* over the prompt fills the cache, then every *decode* step
  runs the model on the newest token only, attending to the cached keys and values.

Prompts of different lengths are batched by left padding: real tokens line up at the
right edge, so every sequence's next token is in the last column.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import torch

from .kv_cache import DenseCache, KVCache, SlidingWindowKVCache
from .mla import LatentKVCache
from .model import Transformer
from .sampling import SamplingParams, sample

Prompts = Sequence[int] | Sequence[Sequence[int]] | torch.Tensor


def pad_left(sequences: Sequence[Sequence[int]], pad_id: int):
    """Stack token lists into ``ids`` [batch, longest] and ``mask`` (1 = token, 0 = padding)."""
    longest = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), longest), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), longest), dtype=torch.long)
    for row, seq in enumerate(sequences):
        if len(seq):
            ids[row, longest - len(seq):] = torch.as_tensor(seq, dtype=torch.long)
            mask[row, longest - len(seq):] = 1
    return ids, mask


def as_token_lists(prompts: Prompts) -> list[list[int]]:
    if isinstance(prompts, torch.Tensor):
        prompts = prompts.tolist() if prompts.dim() == 2 else [prompts.tolist()]
    prompts = list(prompts)
    if not prompts:
        raise ValueError("no prompts given; pass a list of token ids or a list of such lists.")
    if isinstance(prompts[0], int):
        prompts = [prompts]
    return [list(p) for p in prompts]


def check_request(model: Transformer, prompts: list[list[int]], max_new_tokens: int,
                   pad_id: int, samples: int = 1):
    """A clear error for a request ``generate`` cannot serve; ``samples``: the ``n`` asked
    for (one per prompt here)."""
    if samples != 1:
        raise ValueError(f"generate() gives one sample per prompt (got n={samples}); repeat "
                         "the prompt, or use the serving engine, minillm.serve.LLM, whose "
                         "samples share the prompt's KV blocks.")
    if not 0 <= pad_id < model.config.vocab_size:
        raise ValueError(f"pad_id {pad_id} is not a token id of this model (vocab size "
                         f"{model.config.vocab_size}); use e.g. the tokenizer's pad_id.")
    if max_new_tokens <= 0:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}.")
    context = model.config.max_position_embeddings
    for i, prompt in enumerate(prompts):
        if not prompt:
            raise ValueError(f"prompt {i} is empty; give at least one token (e.g. the BOS token).")
        if len(prompt) >= context:
            raise ValueError(f"prompt {i} has {len(prompt)} tokens, but the model's context is "
                             f"{context}; shorten the prompt.")
        if len(prompt) + max_new_tokens > context:
            raise ValueError(
                f"prompt {i} ({len(prompt)} tokens) plus max_new_tokens ({max_new_tokens}) "
                f"exceeds the model's context of {context} tokens; lower max_new_tokens to at "
                f"most {context - len(prompt)}.")


def make_cache(model: Transformer, batch_size: int, max_len: int, window: int | None = None,
               cache_class: type[DenseCache] = KVCache) -> DenseCache:
    """A ``cache_class`` cache for ``max_len`` steps, or a sliding-window one for ``window``
    (a multi-head latent attention model: its latent cache)."""
    if model.config.mla is not None:
        return LatentKVCache(model.config.num_layers)
    if window is not None:
        return SlidingWindowKVCache(model.config, batch_size, window, model.dtype, model.device)
    return cache_class(model.config, batch_size, max_len, model.dtype, model.device)


@torch.inference_mode()
def generate_tokens(model: Transformer, prompts: Prompts, max_new_tokens: int,
                    sampling: SamplingParams = SamplingParams(), *, use_cache: bool = True,
                    window: int | None = None, stop_tokens: Sequence[int] = (),
                    pad_id: int = 0, cache_class: type[DenseCache] = KVCache
                    ) -> Iterator[torch.Tensor]:
    """Yield the next token of every sequence, [batch], as soon as it is chosen (streaming).

    Sequences that emitted a stop token yield ``pad_id`` afterwards; the loop ends when
    all have stopped or after ``max_new_tokens`` steps. ``window`` uses a sliding-window
    cache of that many steps instead of a full one; ``cache_class`` another contiguous
    cache (chapter 03 passes the learner's). Each prompt samples with its own generator
    (seeded alike), so a batch gives every prompt the tokens it gets alone.
    """
    token_lists = as_token_lists(prompts)
    check_request(model, token_lists, max_new_tokens, pad_id, sampling.n)
    device = model.device
    ids, mask = (t.to(device) for t in pad_left(token_lists, pad_id))
    padded = bool((mask == 0).any())
    generators = [sampling.make_generator(device) for _ in token_lists]  # one per request
    stop = torch.tensor(list(stop_tokens), dtype=torch.long, device=device)
    finished = torch.zeros(len(token_lists), dtype=torch.bool, device=device)
    cache = make_cache(model, len(token_lists), ids.shape[1] + max_new_tokens, window,
                       cache_class) if use_cache else None

    logits = model(ids, cache, mask if padded else None, last_only=True)
    prompt_width = ids.shape[1]  # ids[:, prompt_width:] are the tokens generated so far
    for step in range(max_new_tokens):
        token = sample(logits[:, -1], sampling, generators, previous=ids, valid=mask.bool(),
                       output=ids[:, prompt_width:])
        token = torch.where(finished, torch.full_like(token, pad_id), token)
        yield token
        finished |= torch.isin(token, stop)
        if step == max_new_tokens - 1 or bool(finished.all()):
            return
        ids = torch.cat([ids, token[:, None]], dim=1)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        if use_cache:
            logits = model(token[:, None], cache, mask if padded else None, last_only=True)
        else:
            logits = model(ids, None, mask if padded else None, last_only=True)


def generate(model: Transformer, prompts: Prompts, max_new_tokens: int,
             sampling: SamplingParams = SamplingParams(), *, use_cache: bool = True,
             window: int | None = None, stop_tokens: Sequence[int] = (), pad_id: int = 0,
             on_token: Callable[[torch.Tensor], None] | None = None,
             cache_class: type[DenseCache] = KVCache) -> list[list[int]]:
    """Generate up to ``max_new_tokens`` for each prompt; returns the new tokens per prompt.

    Each list ends with the stop token if one was produced. ``on_token`` is called with
    every step's tokens [batch] as they come.
    """
    stream = generate_tokens(model, prompts, max_new_tokens, sampling, use_cache=use_cache,
                             window=window, stop_tokens=stop_tokens, pad_id=pad_id,
                             cache_class=cache_class)
    return collect(stream, stop_tokens, on_token)


def collect(stream: Iterator[torch.Tensor], stop_tokens: Sequence[int],
            on_token: Callable[[torch.Tensor], None] | None = None) -> list[list[int]]:
    """Each sequence's tokens from a stream of per-step columns [batch], up to and with its
    first stop token."""
    columns = []
    for token in stream:
        if on_token is not None:
            on_token(token)
        columns.append(token)
    stop = set(stop_tokens)
    outputs = []
    for row in torch.stack(columns, dim=1).tolist():
        end = next((i + 1 for i, t in enumerate(row) if t in stop), len(row))
        outputs.append(row[:end])
    return outputs
