"""``generate``: continue prompts with the engine, in one call.

    [reply] = generate(model, prompt_ids, 64, SamplingParams(temperature=0.7, seed=0))

A thin client of :class:`~minillm.serve.LLM`: it sizes a paged KV pool for the prompts,
adds them as requests and steps the engine until all are done, so a single prompt gets the
engine's fast decode steps (the native or compiled executor) and a list of prompts is
batched with no padding. Every prompt is computed in the first step and every later step
gives each unfinished prompt one token, so :func:`generate_tokens` can stream one column
[batch] per step. Each prompt samples with its own generator (seeded alike), so a batch
gives every prompt the tokens it gets alone. Stop strings (``SamplingParams(stop=...)``)
need the ``tokenizer``; a reply then ends with the token that completed its stop string.

The dense, left-padded loop of the first chapters (no cache, sliding windows, a cache
class of your own) is :mod:`minillm.reference`; it computes the same tokens and is what the
tests compare this with.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace

import torch

from .model import Transformer
from .reference import Prompts, as_token_lists, check_request
from .sampling import SamplingParams
from .serve import LLM, SchedulerConfig
from .serve.output_processor import RequestOutput

BLOCK_SIZE = 16


def _start(model: Transformer, prompts: Prompts, max_new_tokens: int,
           sampling: SamplingParams, stop_tokens: Sequence[int], pad_id: int, executor: str,
           tokenizer) -> tuple[LLM, list[RequestOutput]]:
    """An engine just large enough for the prompts (every prompt in the first step), and
    their requests' outputs (filled in as the engine steps)."""
    token_lists = as_token_lists(prompts)
    check_request(model, token_lists, max_new_tokens, pad_id, sampling.n)
    blocks = sum(-(-(len(p) + max_new_tokens) // BLOCK_SIZE) for p in token_lists)
    scheduler = SchedulerConfig(max_batch=len(token_lists), chunked_prefill=False,
                                max_tokens_per_step=sum(map(len, token_lists)))
    llm = LLM(model, tokenizer=tokenizer, block_size=BLOCK_SIZE, num_blocks=blocks,
              prefix_caching=False, scheduler=scheduler, executor=executor)
    params = replace(sampling, max_tokens=max_new_tokens, stop_token_ids=tuple(stop_tokens))
    outputs = [llm.outputs[llm.add_request(prompt, params)] for prompt in token_lists]
    if failed := next((output.error for output in outputs if output.error), None):
        raise ValueError(failed)
    return llm, outputs


def _columns(llm: LLM, outputs: list[RequestOutput], max_new_tokens: int, pad_id: int
             ) -> Iterator[torch.Tensor]:
    """Step the engine; after each step, every prompt's token of that step ([batch])."""
    for step in range(max_new_tokens):
        llm.step()
        if step == 0 and (failed := next((o.error for o in outputs if o.error), None)):
            raise RuntimeError(failed)
        yield torch.tensor([o.tokens[step] if len(o.tokens) > step else pad_id
                            for o in outputs])
        if not llm.has_work:
            return


@torch.inference_mode()
def generate_tokens(model: Transformer, prompts: Prompts, max_new_tokens: int,
                    sampling: SamplingParams = SamplingParams(), *,
                    stop_tokens: Sequence[int] = (), pad_id: int = 0,
                    executor: str = "auto", tokenizer=None) -> Iterator[torch.Tensor]:
    """Yield the next token of every prompt, [batch], as soon as it is chosen (streaming).

    Prompts that stopped (a stop token, or a stop string's last token) yield ``pad_id``
    afterwards; the stream ends when all have stopped or after ``max_new_tokens`` steps.
    ``executor``: auto, eager, compiled or native (:mod:`minillm.engine.executors`).
    """
    llm, outputs = _start(model, prompts, max_new_tokens, sampling, stop_tokens, pad_id,
                          executor, tokenizer)
    yield from _columns(llm, outputs, max_new_tokens, pad_id)


@torch.inference_mode()
def generate(model: Transformer, prompts: Prompts, max_new_tokens: int,
             sampling: SamplingParams = SamplingParams(), *, stop_tokens: Sequence[int] = (),
             on_token: Callable[[torch.Tensor], None] | None = None,
             executor: str = "auto", tokenizer=None) -> list[list[int]]:
    """Generate up to ``max_new_tokens`` for each prompt; returns the new tokens per prompt.

    Each list ends with the stop token, or the token that completed a stop string, if one
    came. ``on_token`` is called with every step's tokens [batch] as they come.
    """
    llm, outputs = _start(model, prompts, max_new_tokens, sampling, stop_tokens, 0, executor,
                          tokenizer)
    for column in _columns(llm, outputs, max_new_tokens, 0):
        if on_token is not None:
            on_token(column)
    return [list(output.tokens) for output in outputs]
