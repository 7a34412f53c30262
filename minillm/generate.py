"""``generate``: continue prompts with the serving engine, in one call.

    [reply] = generate(model, prompt_ids, 64, SamplingParams(temperature=0.7, seed=0))

A thin client of :class:`~minillm.serve.LLM`: it sizes a paged KV pool for the prompts,
adds them as requests and steps the engine until all are done, so a single prompt gets the
engine's fast decode steps (the native or compiled executor) and a list of prompts is
batched with no padding. Every prompt is computed in the first step and every later step
gives each unfinished prompt one token, so :func:`generate_tokens` can stream one column
[batch] per step. Each prompt samples with its own generator (seeded alike), so a batch
gives every prompt the tokens it gets alone.

The dense, left-padded loop of the first chapters (no cache, sliding windows, a cache
class of your own) is :mod:`minillm.reference`; it computes the same tokens and is what the
tests compare this with.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace

import torch

from .model import Transformer
from .reference import Prompts, as_token_lists, check_request, collect
from .sampling import SamplingParams

BLOCK_SIZE = 16


def _engine(model: Transformer, prompts: list[list[int]], max_new_tokens: int, executor: str):
    """An engine just large enough for ``prompts``: every prompt in the first step."""
    from .serve import LLM, SchedulerConfig

    blocks = sum(-(-(len(p) + max_new_tokens) // BLOCK_SIZE) for p in prompts)
    scheduler = SchedulerConfig(max_batch=len(prompts), chunked_prefill=False,
                                max_tokens_per_step=sum(map(len, prompts)))
    return LLM(model, block_size=BLOCK_SIZE, num_blocks=blocks, prefix_caching=False,
               scheduler=scheduler, executor=executor)


@torch.inference_mode()
def generate_tokens(model: Transformer, prompts: Prompts, max_new_tokens: int,
                    sampling: SamplingParams = SamplingParams(), *,
                    stop_tokens: Sequence[int] = (), pad_id: int = 0,
                    executor: str = "auto") -> Iterator[torch.Tensor]:
    """Yield the next token of every prompt, [batch], as soon as it is chosen (streaming).

    Prompts that emitted a stop token yield ``pad_id`` afterwards; the stream ends when all
    have stopped or after ``max_new_tokens`` steps. ``executor``: auto, eager, compiled or
    native (:mod:`minillm.serve.executors`).
    """
    token_lists = as_token_lists(prompts)
    check_request(model, token_lists, max_new_tokens, pad_id, sampling.n)
    llm = _engine(model, token_lists, max_new_tokens, executor)
    params = replace(sampling, max_tokens=max_new_tokens, stop_token_ids=tuple(stop_tokens))
    seqs = [llm.add_request(prompt, params) for prompt in token_lists]
    if failed := next((seq.error for seq in seqs if seq.error), None):
        raise ValueError(failed)
    for step in range(max_new_tokens):
        llm.step()
        if step == 0 and (failed := next((s.error for s in seqs if s.error), None)):
            raise RuntimeError(failed)
        yield torch.tensor([seq.output[step] if len(seq.output) > step else pad_id
                            for seq in seqs])
        if not llm.has_work:
            return


def generate(model: Transformer, prompts: Prompts, max_new_tokens: int,
             sampling: SamplingParams = SamplingParams(), *, stop_tokens: Sequence[int] = (),
             on_token: Callable[[torch.Tensor], None] | None = None,
             executor: str = "auto") -> list[list[int]]:
    """Generate up to ``max_new_tokens`` for each prompt; returns the new tokens per prompt.

    Each list ends with the stop token if one was produced. ``on_token`` is called with
    every step's tokens [batch] as they come.
    """
    stream = generate_tokens(model, prompts, max_new_tokens, sampling, stop_tokens=stop_tokens,
                             executor=executor)
    return collect(stream, stop_tokens, on_token)
