"""How a step is computed: the engine's executors, chosen per step by the runner.

    scheduler (what runs) -> runner (how it is laid out) -> executor (how it is computed)

* :class:`~.eager.EagerExecutor`: any step, through the model's own modules and attention
  backend: the readable reference, and what prompt chunks run on (and speculative
  verifications, without a native executor).
* :class:`~.compiled.CompiledExecutor`: decode-only steps, padded to a batch bucket (1, 2,
  4, 8, ...) and run through a ``torch.compile`` graph per bucket, compiled the first time
  a bucket is needed; padding rows have slot -1 and write nowhere.
* :class:`~.native.NativeExecutor`: decode steps and speculative verifications in one C++
  call over the paged pool, for dense models whose every linear layer has a C++ product
  (float32, W8A8, W4A8).

``executor="auto"`` takes the fastest the model allows (native, else compiled for the
weight-only formats, else eager), and eager alone when the model's attention backend is
not the default: a learner's attention then runs in every step. An int8 KV cache
(``kv_cache_dtype="int8"``) is read by the native and eager executors, not the compiled
one (its attention op takes float32 pools): ``auto`` then skips it. An int4 (KIVI) KV
cache is read by the eager executor alone.

Families (:mod:`minillm.config`): the eager executor runs every one. The others (``auto``
as for float32, W8A8 and W4A8 weights; weight-only formats have no native product, so
``auto`` compiles them where the family allows, else runs them eagerly):

====================================  ======  ========  ==============
family                                native  compiled  ``auto`` picks
====================================  ======  ========  ==============
llama, smollm, qwen2, qwen3           yes     yes       native
mistral, gemma3_text (windows)        yes     no        native
qwen2_moe, qwen3_moe, mixtral, olmoe  no      no        eager
deepseek_v3 (latent attention)        no      no        eager
====================================  ======  ========  ==============

The native step runs the dense blocks with their switches (q/k/v biases, QK-norm, Gemma 3's
norms, GeGLU and query scale, a sliding window and a RoPE table per layer); it refuses the
mixture-of-experts layers, latent attention, OLMoE's whole-projection QK-norm and biases
on o_proj or the MLP, with the reason. The compiled one runs the model's own modules but
its attention op cannot mask a window; neither compiles the MoE families' grouped expert
dispatch, whose shapes depend on the routing.
"""

from __future__ import annotations

from typing import Protocol

import torch

from ...attention.kv_quant import kv_cache_dtype_of
from ...model import Transformer
from ..paged_cache import AttentionMetadata, PagedKVCache
from .batch import FlatBatch
from .compiled import CompiledExecutor, compile_problem
from .eager import EagerExecutor
from .native import NativeExecutor, native_problem

EXECUTORS = ("auto", "eager", "compiled", "native")
KV_READERS = {"float32": ("eager", "compiled", "native"), "int8": ("eager", "native"),
              "int4": ("eager",)}  # the executors that read each KV cache dtype
FAST = {"native": (NativeExecutor, native_problem), "compiled": (CompiledExecutor, compile_problem)}


class Executor(Protocol):
    name: str

    def supports(self, metadata: AttentionMetadata) -> bool: ...

    def __call__(self, batch: FlatBatch) -> torch.Tensor: ...


def resolve_executor(model: Transformer, choice: str = "auto",
                     kv_cache_dtype: str | None = None) -> str:
    """The decode executor for ``model`` over a KV cache of ``kv_cache_dtype``: ``choice``,
    with auto resolved (:func:`auto_executor`); a choice the model cannot run is refused
    with the reason."""
    if choice not in EXECUTORS:
        raise ValueError(f"executor must be one of {', '.join(EXECUTORS)}, got {choice!r}")
    readers = KV_READERS[kv_cache_dtype_of(kv_cache_dtype)]
    if choice == "auto":
        picked = auto_executor(model)
        return picked if picked in readers else "eager"
    if choice not in readers:
        raise ValueError(f"the {choice} executor cannot read a {kv_cache_dtype} KV cache "
                         f"(its readers: {', '.join(readers)}): use executor='auto' or "
                         "'eager'")
    if choice in FAST and (reason := FAST[choice][1](model)) is not None:
        raise ValueError(f"the {choice} executor cannot run this model: {reason}; use "
                         "executor='auto' or 'eager'")
    return choice


def make_executors(model: Transformer, cache: PagedKVCache, choice: str) -> list[Executor]:
    """The executors a runner tries in order (the last, eager, supports every step), for a
    resolved ``choice`` and a model prepared for it (:func:`minillm.prepare.prepare_model`)."""
    eager = EagerExecutor(model, cache)
    if choice == "eager":
        return [eager]
    return [FAST[choice][0](model, cache), eager]


def auto_executor(model: Transformer) -> str:
    """The decode executor ``auto`` picks for ``model``: native when every linear layer has
    a C++ product, else compiled when they all compile, else eager; and eager whenever
    the model's attention backend is not the default (the learner's then runs)."""
    if model.attn_backend != "sdpa":
        return "eager"
    if native_problem(model) is None:
        return "native"
    return "compiled" if compile_problem(model) is None else "eager"
