"""Compiled decoding: ``torch.compile`` the one-token step, over a cache of fixed shape.

An optimization written as a transformation of the plain model (the gpt-fast recipe):

1. decode steps use a :class:`~minillm.kv_cache.StaticKVCache`, so every step has the same
   shapes and one compiled graph serves the whole generation;
2. every fp32 ``nn.Linear`` becomes a :class:`MatVecLinear`: the same weights, but under
   compilation a one-token product is written as one sum per output row,
   ``(x[..., None, :] * W).sum(-1)``, which Inductor turns into a vectorized C++ loop that
   streams the weight once with both cores. Left as a matmul, the compiled graph calls
   MKL's ``mm``, which on the AMD EPYC of this course's machines reads a batch-1 weight at
   about 10 GB/s, one core's worth (``docs/benchmarks.md``). Compressed weights
   (int8/int4, :mod:`minillm.quant.weight_only`) use the same formulation on their codes;
3. the small element-wise ops (norms, RoPE, SiLU) fuse into few kernels, but each is
   computed once per step, not once per output row of the product that reads it
   (``COMPUTE_INPUTS_ONCE``);
4. a one-token step's attention is written out (:class:`DecodeAttention`), so it fuses
   into the step's kernels instead of calling the SDPA kernel once per layer;
5. q/k/v and gate/up are each one product (:func:`~minillm.fused_projections.fuse_projections`).

The prompt (prefill) and padded batches still run eagerly. Compiling takes a minute or
two on a 2-core CPU, so this pays off for long generations and benchmarks, not for tests.
"""

from __future__ import annotations

import math
import types

import torch
from torch import nn

from .fused_projections import fuse_projections
from .kv_cache import StaticKVCache
from .linear import MAX_REDUCTION_ROWS, CompressedLinear, replace_linears
from .model import Attention, Transformer
from .quant.weight_only import WeightOnlyLinear

# Inductor inlines a cheap element-wise producer (an RMSNorm, silu(gate) * up) into each
# consumer's loop. Into a one-token product that means recomputing the layer's input for
# every output row: 49,152 times for the LM head. Materializing every producer that has
# more than one op or more than one reader computes each input once (int8 step 21.4 ->
# 14.8 ms, fp32 28.6 -> 24.3 ms on the Intel Xeon of docs/benchmarks.md).
COMPUTE_INPUTS_ONCE = {"realize_reads_threshold": 1, "realize_cpu_opcount_threshold": 1}
# With int4 weights the op-count rule also materializes each dequantized weight (unpack,
# scale: three ops) in fp32, the memory traffic the format exists to avoid; the
# reader-count rule alone is the faster choice there (step 22.6 -> 20.9 ms, not 25.0).
COMPUTE_INPUTS_ONCE_INT4 = {"realize_reads_threshold": 1}
# Before each call Dynamo checks that the graph still fits its inputs ("guards"). The
# checks on every module and parameter of the model took 0.9 ms of a 15 ms int8 step;
# a decode model does not change between steps, so only the inputs are checked.
NO_MODULE_GUARDS = torch.compiler.skip_guard_on_all_nn_modules_unsafe


def _with_own_code(function):
    """A copy of ``function`` with a code object of its own. Dynamo keeps compiled graphs per
    code object; without its module guards it would hand one model's graph to the next model
    compiled in the same process (a different size or weight format: a crash, or wrong
    numbers). Each compiled model gets its own."""
    return types.FunctionType(function.__code__.replace(), function.__globals__,
                              function.__name__, function.__defaults__, function.__closure__)


def _realize_rules(model: Transformer) -> dict:
    """Which of the two rule sets above suits ``model``'s weights."""
    has_int4 = any(isinstance(m, WeightOnlyLinear) and m.bits == 4 for m in model.modules())
    return COMPUTE_INPUTS_ONCE_INT4 if has_int4 else COMPUTE_INPUTS_ONCE


class MatVecLinear(nn.Linear):
    """An ``nn.Linear`` whose compiled product for a few rows is one sum per output row."""

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> nn.Module:
        """The same parameters (shared, so a tied head stays tied); other formats unchanged."""
        if type(linear) is not nn.Linear:
            return linear
        matvec = cls(linear.in_features, linear.out_features, linear.bias is not None,
                     device="meta")  # no storage of its own: it takes the layer's parameters
        matvec.weight, matvec.bias = linear.weight, linear.bias
        return matvec

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        if rows > MAX_REDUCTION_ROWS or not torch.compiler.is_compiling():
            return super().forward(x)
        y = (x.unsqueeze(-2) * self.weight).sum(-1)
        return y if self.bias is None else y + self.bias


class DecodeAttention:
    """An attention backend that, compiled for one query token, is written out as math.

    With one query, each KV group's query heads are a [group, head_dim] matrix: scores against
    the cached keys, masked, softmax, times the values (Vaswani et al. 2017, eq. 1, grouped as
    in GQA, so K and V are never repeated). Inductor fuses that into the step's own loops;
    PyTorch's SDPA kernel cost ~55 µs per layer and call. Otherwise the model's backend runs.
    """

    def __init__(self, backend):
        self.backend = backend

    def __call__(self, q, k, v, mask=None):
        if not torch.compiler.is_compiling() or q.shape[2] != 1:
            return self.backend(q, k, v, mask)
        batch, heads, _, head_dim = q.shape
        kv_heads = k.shape[1]
        grouped = q.view(batch, kv_heads, heads // kv_heads, head_dim)
        scores = grouped @ k.transpose(-2, -1) / math.sqrt(head_dim)  # [b, kv, group, keys]
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return (scores.softmax(-1) @ v).view(batch, heads, 1, head_dim)


def compile_decode(model: Transformer, freezing: bool | None = None,
                   autotune: bool = True) -> Transformer:
    """Make ``model`` run single-token, unpadded steps through a compiled graph (in place).

    ``autotune`` times Inductor's GEMM kernels against MKL for the products that stay
    matmuls (steps of more than ``MAX_REDUCTION_ROWS`` rows; slower to compile).
    ``freezing`` (default: only for models without compressed weights) lets Inductor treat
    weights as constants; on compressed weights it would fold the dequantization back into
    fp32 constants and lose the point.

    The model must not change afterwards: Dynamo does not re-check its modules and
    parameters before each step (``NO_MODULE_GUARDS``), as freezing already assumes.
    """
    if freezing is None:
        freezing = not any(isinstance(m, CompressedLinear) for m in model.modules())
    fuse_projections(model)
    replace_linears(model, MatVecLinear.from_linear, skip=())
    for attention in model.modules():
        if isinstance(attention, Attention) and not isinstance(attention.backend, DecodeAttention):
            attention.backend = DecodeAttention(attention.backend)
    eager_forward = model.forward
    compiled_forward = torch.compile(types.MethodType(_with_own_code(type(model).forward), model),
                                     fullgraph=True, dynamic=False,
                                     options={"max_autotune": autotune, "freezing": freezing,
                                              **_realize_rules(model),
                                              "guard_filter_fn": NO_MODULE_GUARDS})

    def forward(input_ids, cache=None, attention_mask=None, last_only=False):
        if input_ids.shape[1] == 1 and attention_mask is None and isinstance(cache, StaticKVCache):
            return compiled_forward(input_ids, cache, None, last_only)
        return eager_forward(input_ids, cache, attention_mask, last_only)

    model.forward = forward
    model.cache_class = StaticKVCache
    return model
