"""The native executor: a decode step's every block in one C++ call over the paged pool.

A decode step of a small model is short: SmolLM2's W8A8 products stream 135 MB in ~4 ms
on the course's 2-core machines. Compiled by ``torch.compile``, the step is ~330 kernels
and op calls whose launches take ~3 ms of it; llama.cpp avoids that by running the whole
step in C++, and so does this executor (``csrc/decode_layers.cpp``): the embedding lookup
in PyTorch (scaled, for Gemma), then one call that runs every block for all of the step's
sequences (each weight read once for the whole batch; attention through each sequence's
block table, and the new keys and values written at their slots) and, when the head has
a C++ product too, the final norm and the logits.

A speculative verification (the newest token and a few guesses per sequence) runs here
too: each token becomes a row of its own, with its sequence's block table and a context
that ends at it. Every row's keys and values are written before any row attends, so each
guess sees the ones before it: the causal attention of a short chunk, as decodes.

Families: the dense blocks of Llama, Qwen2, Qwen3, Mistral and Gemma 3. What a family
adds to Llama's block is a per-block switch on the C++ side (``csrc/block_options.h``),
filled here from the model's modules: q/k/v biases, QK-norm, Gemma's norms on the outputs
of attention and the MLP (every Gemma norm passed as its effective weight ``1 + w``),
GeGLU, the query scale of ``query_pre_attn_scalar``, and per layer its sliding window and
RoPE table (:meth:`~minillm.config.ModelConfig.attention_kinds`). A windowed layer never
reads the keys behind its window, so the blocks the engine gives back there (their table
entries sent as block 0) are never read. Mixture-of-experts layers, latent attention and
OLMoE's whole-projection QK-norm are refused (:func:`native_problem`).

Products: float32 ``nn.Linear`` (``csrc/fp32_product.h``), per-channel int8 weights with
int8 activations (W8A8) and grouped int4 weights with int8 activations (W4A8); a model may
mix them. Under tensor parallelism each rank runs its shards, and the C++ step calls back
into Python after o_proj and down_proj for the reduction their
:class:`~minillm.parallel.layers.RowParallelLinear` runs eagerly (an all-reduce); the
vocabulary-parallel embedding and head stay in PyTorch.

The numbers are float32 like the eager model's, summed in another order: logits agree to
~1e-5 relative (``tests/test_executors.py``, ``tests/test_native_families.py``); with
int8 activations, as far as rounding a
vector to int8 can move them. An int8 KV cache (:mod:`minillm.attention.kv_quant`) is
written and read here too: the C++ step rounds each new head as the eager path does and
dequantizes on the fly.
"""

from __future__ import annotations

import torch
from torch import nn

from ...compile import MatVecLinear
from ...model import GemmaRMSNorm, RMSNorm, Transformer
from ...native import native_kernels
from ...parallel.layers import ColumnParallelLinear, RowParallelLinear
from ...quant.int8_activations import Int8ActivationLinear
from ...quant.w4a8 import W4A8Linear
from ..paged_cache import AttentionMetadata, PagedKVCache
from .batch import FlatBatch

NATIVE_LAYERS = (nn.Linear, MatVecLinear, Int8ActivationLinear, W4A8Linear)
# Steps whose sequences have at most this many new tokens: decodes and speculative
# verifications (the newest token and its guesses). Longer prompt chunks stay eager, where
# a matmul library's blocking beats these loops.
MAX_TOKENS_PER_SEQUENCE = 9
QKV = ("q_proj", "k_proj", "v_proj")  # the layers that may have a bias (Qwen2's)


def native_problem(model: Transformer) -> str | None:
    """Why ``model``'s decode steps cannot run natively, or None."""
    if model.dtype != torch.float32:
        return f"native steps run float32 activations, not {model.dtype}"
    config = model.config
    unsupported = [("mixture-of-experts layers", config.moe is not None),
                   ("multi-head latent attention", config.mla is not None),
                   ("QK-norm over the whole q and k projections", config.qk_norm_whole),
                   ("a bias on o_proj", config.attention_bias),
                   ("MLP biases", config.mlp_bias)]
    if missing := [what for what, present in unsupported if present]:
        return (f"native steps run the dense blocks of Llama, Qwen, Mistral and Gemma 3; this "
                f"model has {', '.join(missing)} (a {config.family} model)")
    for index, block in enumerate(model.layers):
        for name, layer in _linears(block).items():
            layer = _unwrapped(layer)
            if type(layer) not in NATIVE_LAYERS or (layer.bias is not None and
                                                    name not in QKV):
                return (f"block {index} has a {type(layer).__name__}"
                        f"{' with a bias' if layer.bias is not None else ''}; native steps "
                        "take float32 nn.Linear or int8-activation (W8A8/W4A8) layers "
                        "without bias (but on q, k and v)")
    if native_kernels() is None:
        return "minillm's C++ kernels are not built on this machine (see the warning)"
    return None


def _linears(block) -> dict[str, nn.Module]:
    attn, mlp = block.attn, block.mlp
    return {"q_proj": attn.q_proj, "k_proj": attn.k_proj, "v_proj": attn.v_proj,
            "o_proj": attn.o_proj, "gate_proj": mlp.gate_proj, "up_proj": mlp.up_proj,
            "down_proj": mlp.down_proj}


def _unwrapped(layer: nn.Module) -> nn.Module:
    """A tensor-parallel layer's own shard (the product C++ computes); others as they are."""
    return layer.shard if isinstance(layer, (ColumnParallelLinear, RowParallelLinear)) else layer


def _product(layer: nn.Module, biased: bool = False) -> list[torch.Tensor] | None:
    """The tensors of a layer's C++ product, or None if it has none (a layer with a bias
    has none unless ``biased``: the step then adds the bias itself)."""
    layer = _unwrapped(layer)
    if getattr(layer, "bias", None) is not None and not biased:
        return None
    if type(layer) in (nn.Linear, MatVecLinear) and layer.weight.dtype == torch.float32:
        return [layer.weight.detach().contiguous()]
    if isinstance(layer, Int8ActivationLinear):
        return [layer.codes.contiguous(), layer.scales.contiguous(), layer.code_sums.contiguous()]
    if isinstance(layer, W4A8Linear):
        return [layer.codes.contiguous(), layer.scales.contiguous(), layer.zeros.contiguous()]
    return None


def _norm_weight(norm: nn.Module) -> torch.Tensor:
    """The weight an RMSNorm multiplies by: Gemma's ``1 + w``, in float32 as it computes it."""
    weight = norm.weight.detach()
    return (1.0 + weight.float() if isinstance(norm, GemmaRMSNorm) else weight).contiguous()


def _block_parts(block) -> list[list[list[torch.Tensor]]]:
    """The six parts ``DecodeLayers`` takes per block, in its order (q, k and v share an
    input, and so do gate and up: each group is computed as one in C++)."""
    attn, mlp = block.attn, block.mlp
    return [[[_norm_weight(block.attn_norm)]],
            [_product(getattr(attn, name), biased=True) for name in QKV],
            [_product(attn.o_proj)], [[_norm_weight(block.mlp_norm)]],
            [_product(mlp.gate_proj), _product(mlp.up_proj)], [_product(mlp.down_proj)]]


def _block_options(block) -> dict[str, torch.Tensor]:
    """A block's optional tensors, by the names ``DecodeLayers`` takes (csrc/block_options.h):
    Qwen2's q, k and v biases, QK-norm (Qwen3, Gemma 3), Gemma's output norms."""
    attn, options = block.attn, {}
    biases = [_unwrapped(getattr(attn, name)).bias for name in QKV]
    if biases[0] is not None:
        options["qkv_bias"] = torch.cat([b.detach().float() for b in biases]).contiguous()
    norms = {"q_norm": attn.q_norm, "k_norm": attn.k_norm,
             "attention_out_norm": block.attn_out_norm, "mlp_out_norm": block.mlp_out_norm}
    options.update({name: _norm_weight(norm) for name, norm in norms.items()
                    if isinstance(norm, RMSNorm)})
    return options


def _reduction_of(layer: nn.Module):
    """The reduction a tensor-parallel rank applies to ``layer``'s partial output (its
    :class:`~minillm.parallel.layers.RowParallelLinear` runs it eagerly), or None."""
    return layer.reduce if isinstance(layer, RowParallelLinear) else None


class NativeExecutor:
    """Decode-only steps of any batch size in one C++ call (see the module docstring).
    The C++ side reads the model's own weights (no copy), so the model must not change
    while the executor lives."""

    name = "native"

    def __init__(self, model: Transformer, cache: PagedKVCache):
        if (problem := native_problem(model)) is not None:
            raise ValueError(f"no native decode steps for this model: {problem}")
        if cache.int4 is not None:
            raise ValueError("native steps read float32 and int8 KV pools, not int4 (KIVI): "
                             "use the eager executor")
        self.model, self.cache = model, cache
        block = model.layers[0]
        self.reduce = (_reduction_of(block.attn.o_proj), _reduction_of(block.mlp.down_proj))
        head = _product(model.lm_head)  # None for a vocabulary-parallel head
        self.head_in_cpp = head is not None
        self.last_hidden: torch.Tensor | None = None  # the last call's rows, before the norm
        self.ropes = [model.rope] + ([model.local_rope] if model.local_rope is not None else [])
        attn, kinds = model.layers[0].attn, [block.kind for block in model.layers]
        self.layers = native_kernels().DecodeLayers(
            blocks=[_block_parts(block) for block in model.layers],
            options=[_block_options(block) for block in model.layers],
            windows=[kind.window or 0 for kind in kinds],
            rope_tables=[int(kind.local_rope) for kind in kinds],
            head=[[[_norm_weight(model.norm)]], [head]] if head is not None else [],
            eps=model.config.rms_norm_eps, heads=attn.num_heads, kv_heads=attn.num_kv_heads,
            head_dim=model.config.head_dim, query_scale=attn.query_scale,
            activation=model.config.hidden_act)

    def supports(self, metadata: AttentionMetadata) -> bool:
        return max(metadata.query_lens) <= MAX_TOKENS_PER_SEQUENCE

    def __call__(self, batch: FlatBatch) -> torch.Tensor:
        meta, model = batch.metadata, self.model
        tables, lengths = meta.block_tables, meta.context_lens
        if not meta.decode_only:  # one row per token, attending to its own prefix
            tables = tables.repeat_interleave(torch.tensor(meta.query_lens), 0)
            lengths = batch.positions + 1
        x = model.embed(batch.token_ids).float().contiguous()  # [tokens, hidden]
        out = self.layers.step(x, [rope.cos[batch.positions] for rope in self.ropes],
                               [rope.sin[batch.positions] for rope in self.ropes],
                               meta.slot_mapping, tables, lengths, self.cache.keys,
                               self.cache.values, self.cache.key_scales,
                               self.cache.value_scales, *self.reduce)
        hidden = x if self.head_in_cpp else out  # the C++ step leaves x final, before the norm
        self.last_hidden = hidden[batch.logits_at]  # not a 1-token prefill chunk's row
        return out[batch.logits_at] if self.head_in_cpp else model.head(self.last_hidden)
