"""Attention through a rounded KV cache, in the engine, for any quantizer: how much int8 and
int4 keys and values change SmolLM2's attention (chapter 12, section 9, passes the
learner's functions beside the library's).

:class:`RoundedReads` is a ``decode_attention`` for ``LLM`` (the seam of chapter 12's lab),
so the engine's own steps call it with every layer's real queries and pool. For each of
its *readings* (a rounding of the keys and one of the values: float32 blocks [blocks,
block_size, kv_heads, head_dim] -> rounded and back, the same shape) it reads the blocks
the step's sequences hold through them, attends with the library's paged attention and
notes, per call (one layer of one step), the relative error ``||out - exact|| / ||exact||``
against attention over the unrounded pool. It returns the exact attention, or the one
through the reading it is told to ``follow``. The pool itself stays float32, unchanged.

* Per token (:func:`int8_rounding`, :func:`int4_rounding` with ``per_channel=False``), a
  read rounded this way is exactly what a pool storing those codes gives back: the
  engine's int8 cache, for the library's int8 functions.
* Per channel over a block (KIVI's keys, ``per_channel=True``) rounds every block the
  step reads, the one a sequence is still filling too (KIVI keeps that one in float32,
  and its empty slots would join the range): :func:`layer_errors` therefore measures one
  prefill of a prompt that fills its blocks exactly, where every block is full.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..attention.paged import paged_attention
from ..model import Transformer
from ..sampling import SamplingParams
from ..serve import LLM, SchedulerConfig

Rounding = Callable[[torch.Tensor], torch.Tensor]  # blocks -> the same blocks, rounded


def int8_rounding(quantize: Callable, dequantize: Callable) -> Rounding:
    """Per token and KV head: ``quantize(x) -> (codes, scales)``, ``dequantize(codes,
    scales) -> x`` (``minillm.attention.kv_quant``'s signatures)."""
    return lambda blocks: dequantize(*quantize(blocks))


def int4_rounding(quantize: Callable, dequantize: Callable, per_channel: bool) -> Rounding:
    """``quantize(x, dim) -> (codes, scales, minimums)``, ``dequantize(codes, scales,
    minimums, dim)`` (``minillm.attention.kv_int4``'s): each channel over a block's tokens
    (dim 1 of the blocks) or each token's channels (dim -1)."""
    dim = 1 if per_channel else -1
    return lambda blocks: dequantize(*quantize(blocks, dim), dim)


def no_rounding(blocks: torch.Tensor) -> torch.Tensor:
    """The blocks as the float32 pool holds them (a reading that rounds one side only)."""
    return blocks


Reading = tuple[Rounding, Rounding]  # (keys' rounding, values')


@dataclass
class RoundedReads:
    """A ``decode_attention`` that measures, at every call, each reading's relative error
    (``errors[name]``, one entry per call) and returns the attention through the reading
    named ``follow`` (None: through the unrounded pool, so the model runs unchanged and
    each layer's error is its own, with no earlier layer's rounding in its inputs)."""

    readings: dict[str, Reading]
    follow: str | None = None
    errors: dict[str, list[float]] = field(init=False)

    def __post_init__(self):
        if self.follow is not None and self.follow not in self.readings:
            raise ValueError(f"follow={self.follow!r} names no reading: give one of "
                             f"{', '.join(self.readings)} or None")
        self.errors = {name: [] for name in self.readings}

    def __call__(self, q: torch.Tensor, key_pool: torch.Tensor, value_pool: torch.Tensor,
                 block_tables: list[list[int]], query_lens: list[int],
                 context_lens: list[int]) -> torch.Tensor:
        exact = _attend(q, key_pool, value_pool, block_tables, query_lens, context_lens)
        used = sorted({block for table in block_tables for block in table})
        where = {block: i for i, block in enumerate(used)}  # the read blocks, in a row
        tables = [[where[block] for block in table] for table in block_tables]
        keys, values = key_pool[used], value_pool[used]
        outputs = {}
        for name, (round_keys, round_values) in self.readings.items():
            outputs[name] = _attend(q, round_keys(keys).to(keys.dtype),
                                    round_values(values).to(values.dtype), tables,
                                    query_lens, context_lens)
            self.errors[name].append(((outputs[name] - exact).norm() / exact.norm()).item())
        return exact if self.follow is None else outputs[self.follow]


def _attend(q: torch.Tensor, key_pool: torch.Tensor, value_pool: torch.Tensor,
            block_tables: list[list[int]], query_lens: list[int],
            context_lens: list[int]) -> torch.Tensor:
    """The flat queries of a step [tokens, heads, head_dim], each sequence's last
    ``query_lens[s]`` tokens, causal over its cached tokens (the library's paged attention,
    one sequence at a time)."""
    out, first = torch.empty_like(q), 0
    for table, n, length in zip(block_tables, query_lens, context_lens, strict=True):
        rows = q[first:first + n].transpose(0, 1)[None]  # [1, heads, n, head_dim]
        out[first:first + n] = paged_attention(rows, key_pool, value_pool,
                                               torch.tensor([table]),
                                               torch.tensor([length]))[0].transpose(0, 1)
        first += n
    return out


def layer_errors(model: Transformer, ids: list[int], readings: dict[str, Reading],
                 block_size: int = 16) -> dict[str, list[float]]:
    """Each reading's relative attention error in every layer (a list, layer 0 first) over
    one prefill of ``ids`` in the engine, the model running on the unrounded pool.
    ``len(ids)`` must fill whole blocks, so that rounding a block per channel sees only its
    own tokens (module docstring)."""
    if len(ids) % block_size:
        whole = len(ids) // block_size * block_size
        raise ValueError(f"{len(ids)} tokens do not fill blocks of {block_size}: give a "
                         f"multiple of {block_size} (ids[:{whole}], say)")
    reads = RoundedReads(readings)
    llm = LLM(model, decode_attention=reads, block_size=block_size, prefix_caching=False,
              num_blocks=len(ids) // block_size + 1,
              scheduler=SchedulerConfig(max_batch=1, max_tokens_per_step=len(ids)))
    llm.generate([ids], SamplingParams(max_tokens=1), progress=False)
    return reads.errors
