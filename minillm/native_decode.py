"""Native decoding: every block of a one-token step in one C++ call (W8A8 or W4A8 weights).

:func:`~minillm.compile.compile_decode` turns the step into a graph of ~330 kernels and
ops. On a 2-core CPU each costs a few microseconds to launch, and together they take about
3 ms of an 8 ms int8 step, while the products themselves stream SmolLM2's 135 MB of int8
weights in about 5 ms. llama.cpp avoids that overhead by running the whole step in C++.
:func:`native_decode` does the same for models whose linear layers are
:class:`~minillm.quant.int8_activations.Int8ActivationLinear` or
:class:`~minillm.quant.w4a8.W4A8Linear` (``to_int8_activations``): the blocks run in
``csrc/decode_layers.cpp`` (the same math as :class:`~minillm.model.Block`, written as
loops), the embedding, final norm and LM head stay in Python.

Like ``compile_decode`` it is a transformation of the plain model (gpt-fast's recipe): it
serves unpadded batch-1 steps over a :class:`~minillm.kv_cache.StaticKVCache`; every other
call (prompts, padded batches) runs the model as before. The step's numbers are float32
like the model's, summed in a different order: logits agree to ~1e-5 relative
(``tests/test_native_decode.py``).
"""

from __future__ import annotations

import torch

from .fused_projections import fuse_projections
from .kv_cache import StaticKVCache
from .model import Transformer
from .native import native_kernels
from .quant.int8_activations import Int8ActivationLinear
from .quant.w4a8 import W4A8Linear


def _projections(block) -> list:
    """The block's four products, once q/k/v and gate/up are fused."""
    return [block.attn.qkv_proj, block.attn.o_proj, block.mlp.gate_up_proj, block.mlp.down_proj]


def _linears(block) -> list:
    """The block's linear layers, fused or not."""
    attn, mlp = block.attn, block.mlp
    layers = [attn.q_proj, attn.k_proj, attn.v_proj, attn.qkv_proj, attn.o_proj, mlp.gate_proj,
              mlp.up_proj, mlp.gate_up_proj, mlp.down_proj]
    return [layer for layer in layers if layer is not None]


def _product_tensors(layer) -> list[torch.Tensor]:
    """A product's codes, scales, and code sums (int8) or zero points (int4)."""
    third = layer.code_sums if isinstance(layer, Int8ActivationLinear) else layer.zeros
    return [layer.codes.contiguous(), layer.scales.contiguous(), third.contiguous()]


def _block_tensors(block) -> list[torch.Tensor]:
    """The 14 tensors ``DecodeLayers`` takes per block, in its order."""
    qkv, o, gate_up, down = (_product_tensors(layer) for layer in _projections(block))
    return [block.attn_norm.weight.detach(), *qkv, *o,
            block.mlp_norm.weight.detach(), *gate_up, *down]


def check_native_decode(model: Transformer) -> None:
    """Raise a ValueError saying what is missing if ``model`` cannot decode natively."""
    if model.dtype != torch.float32:
        raise ValueError(f"native decoding runs float32 activations, not {model.dtype}")
    for index, block in enumerate(model.layers):
        for layer in _linears(block):
            if not isinstance(layer, (Int8ActivationLinear, W4A8Linear)) or \
                    layer.bias is not None:
                raise ValueError(
                    f"native decoding needs int8 activations (W8A8 or W4A8 linear layers, "
                    f"without bias); block {index} has {type(layer).__name__}. Quantize to "
                    "per-channel int8 or grouped int4 and call to_int8_activations first.")


def native_decode(model: Transformer) -> Transformer:
    """Make ``model`` run unpadded batch-1 one-token steps in C++ (in place; see the module
    docstring). The model must not change afterwards: the C++ side holds its weights."""
    check_native_decode(model)
    fuse_projections(model)
    config = model.config
    blocks = native_kernels().DecodeLayers([_block_tensors(b) for b in model.layers],
                                           config.rms_norm_eps, config.num_heads,
                                           config.num_kv_heads, config.head_dim)
    eager_forward = model.forward

    def forward(input_ids, cache=None, attention_mask=None, last_only=False):
        if input_ids.shape != (1, 1) or attention_mask is not None or \
                not isinstance(cache, StaticKVCache):
            return eager_forward(input_ids, cache, attention_mask, last_only)
        position = int(cache.next_step)
        x = model.embed_tokens(input_ids).reshape(-1).float().contiguous()
        blocks.step(x, model.rope.cos[position], model.rope.sin[position], position,
                    cache.keys, cache.values)
        cache.advance(1)
        return model.lm_head(model.norm(x.view(1, 1, -1)))

    model.forward = forward
    model.cache_class = StaticKVCache
    return model
