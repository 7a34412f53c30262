"""What a compiled decode step is made of: the formulation Inductor turns into fast loops.

The engine's compiled executor (:mod:`minillm.engine.executors.compiled`) runs decode steps
through ``torch.compile`` graphs; this module holds the choices that make those graphs
fast on a CPU, each a transformation of the plain model or an Inductor setting:

1. every fp32 ``nn.Linear`` becomes a :class:`MatVecLinear`: the same weights, but under
   compilation a product of a few rows is written as one sum per output row,
   ``(x[..., None, :] * W).sum(-1)``, which Inductor turns into a vectorized C++ loop that
   streams the weight once with both cores. Left as a matmul, the compiled graph calls
   MKL's ``mm``, which on the AMD EPYC of this course's machines reads a batch-1 weight at
   about 10 GB/s, one core's worth (``docs/benchmarks.md``). Compressed weights
   (int8/int4, :mod:`minillm.quant.weight_only`) use the same formulation on their codes;
2. the small element-wise ops (norms, RoPE, SiLU) fuse into few kernels, but each is
   computed once per step, not once per output row of the product that reads it
   (:data:`COMPUTE_INPUTS_ONCE`, :func:`realize_rules`);
3. Dynamo checks only the inputs before each call, not every module of the model
   (:data:`NO_MODULE_GUARDS`), and each compiled model gets its own code object
   (:func:`with_own_code`).
"""

from __future__ import annotations

import types

import torch
from torch import nn

from .linear import MAX_REDUCTION_ROWS
from .model import Transformer
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


def with_own_code(function):
    """A copy of ``function`` with a code object of its own. Dynamo keeps compiled graphs per
    code object; without its module guards it would hand one model's graph to the next model
    compiled in the same process (a different size or weight format: a crash, or wrong
    numbers). Each compiled model gets its own."""
    return types.FunctionType(function.__code__.replace(), function.__globals__,
                              function.__name__, function.__defaults__, function.__closure__)


def realize_rules(model: Transformer) -> dict:
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
