"""A decoder of the Llama, Mistral, Qwen and Gemma 3 families, written to be read top to bottom.

    tokens -> embedding -> N x Block -> RMSNorm -> lm_head -> logits
    Block:  x = x + Attention(RMSNorm(x));  x = x + MLP(RMSNorm(x))

Attention has separate query and key/value head counts, so MHA (equal counts), GQA
(fewer K/V heads) and MQA (one K/V head) are the same code. The score computation is
delegated to a backend from :mod:`minillm.attention`, chosen by name.

The other families differ by a few components the config switches on
(:mod:`minillm.config`): q/k/v biases (Qwen2), a norm over each head of q and k
(``q_norm``/``k_norm``: Qwen3, Gemma 3), Gemma's ``(1 + w)`` norm also on the outputs of
attention and the MLP (``attn_out_norm``/``mlp_out_norm``; identities elsewhere), a GELU
gate, scaled embeddings, and layers of several :class:`~minillm.config.AttentionKind`:
sliding-window or full attention, with their own RoPE base. Layers of one kind share their
RoPE tables and mask (:meth:`Transformer.layer_inputs`).
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from .attention import get_backend
from .config import AttentionKind, ModelConfig
from .mla import LatentAttention, LatentShape
from .moe import MoE
from .rope import RotaryEmbedding, apply_rotary

# each layer kind's (rope_cos, rope_sin, mask) for one forward pass
LayerInputs = dict[AttentionKind, tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]


class RMSNorm(nn.Module):
    """x / rms(x) * weight (Zhang & Sennrich 2019, eq. 4): LayerNorm without the mean."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class GemmaRMSNorm(RMSNorm):
    """Gemma's RMSNorm: x / rms(x) * (1 + weight), multiplied in float32 before the cast
    back (the stored weights are offsets from one, so they start at zero)."""

    def __init__(self, dim: int, eps: float):
        super().__init__(dim, eps)
        nn.init.zeros_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * (1.0 + self.weight.float())).to(x.dtype)


def make_norm(config: ModelConfig, dim: int) -> RMSNorm:
    return (GemmaRMSNorm if config.gemma_norms else RMSNorm)(dim, config.rms_norm_eps)


ACTIVATIONS = {"silu": F.silu, "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh")}


class MLP(nn.Module):
    """Gated feed-forward (Shazeer 2020, eq. 6): down(act(gate(x)) * up(x)), SwiGLU with
    silu, GeGLU with (tanh-approximated) GELU."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        d, hidden, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.gate_proj = nn.Linear(d, hidden, bias=bias)
        self.up_proj = nn.Linear(d, hidden, bias=bias)
        self.down_proj = nn.Linear(hidden, d, bias=bias)
        self.act = ACTIVATIONS[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class Attention(nn.Module):
    """Multi-head attention with ``num_kv_heads`` key/value heads shared by groups of queries.

    With QK-norm, each head of q and k is RMS-normalised before RoPE (OLMoE normalises the
    whole q and k projections instead, all heads at once: ``qk_norm_whole``). The backends scale
    scores by 1/sqrt(head_dim); a ``query_pre_attn_scalar`` s asks for 1/sqrt(s), so q is
    multiplied by sqrt(head_dim / s) first (``query_scale``)."""

    def __init__(self, config: ModelConfig, layer_index: int, backend: str):
        super().__init__()
        d, hd, bias = config.hidden_size, config.head_dim, config.attention_bias
        qkv_bias = bias or config.qkv_bias
        self.num_heads, self.num_kv_heads, self.head_dim = (
            config.num_heads, config.num_kv_heads, config.head_dim)
        self.layer_index = layer_index
        self.q_proj = nn.Linear(d, config.num_heads * hd, bias=qkv_bias)
        self.k_proj = nn.Linear(d, config.num_kv_heads * hd, bias=qkv_bias)
        self.v_proj = nn.Linear(d, config.num_kv_heads * hd, bias=qkv_bias)
        self.o_proj = nn.Linear(config.num_heads * hd, d, bias=bias)
        self.qk_norm_whole = config.qk_norm_whole
        q_width, k_width = ((config.num_heads * hd, config.num_kv_heads * hd)
                            if config.qk_norm_whole else (hd, hd))
        self.q_norm = make_norm(config, q_width) if config.qk_norm else nn.Identity()
        self.k_norm = make_norm(config, k_width) if config.qk_norm else nn.Identity()
        scalar = config.query_pre_attn_scalar
        self.query_scale = 1.0 if scalar is None else (hd / scalar) ** 0.5
        self.backend = get_backend(backend)

    def _split_heads(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        batch, seq, _ = x.shape
        return x.view(batch, seq, heads, self.head_dim).transpose(1, 2)

    def _normed_heads(self, x: torch.Tensor, heads: int, norm: nn.Module) -> torch.Tensor:
        """x [batch, seq, heads * head_dim] -> QK-normed heads [batch, heads, seq, head_dim]."""
        if self.qk_norm_whole:
            return self._split_heads(norm(x), heads)
        return norm(self._split_heads(x, heads))

    def forward(self, x, rope_cos, rope_sin, mask, cache=None):
        batch, seq, _ = x.shape
        q = self._normed_heads(self.q_proj(x), self.num_heads, self.q_norm)
        k = self._normed_heads(self.k_proj(x), self.num_kv_heads, self.k_norm)
        v = self._split_heads(self.v_proj(x), self.num_kv_heads)
        q, k = apply_rotary(q, rope_cos, rope_sin), apply_rotary(k, rope_cos, rope_sin)
        if self.query_scale != 1.0:
            q = q * self.query_scale
        if cache is None:
            out = self.backend(q, k, v, mask)  # [batch, heads, seq, head_dim]
        else:  # the cache stores k, v and attends over every key the queries may see
            out = cache.attend(self.layer_index, q, k, v, mask, self.backend)
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, -1))


class LatentAttentionLayer(LatentAttention):
    """Multi-head latent attention (:mod:`minillm.mla`) as layer ``layer_index``'s attention.
    A cache (the dense loop's :class:`~minillm.mla.LatentKVCache`, the engine's latent pool)
    stores its latents and attends: ``cache.attend_latent(self, x, cos, sin, mask)``."""

    def __init__(self, config: ModelConfig, layer_index: int):
        shape = LatentShape(config.num_heads, **config.mla)
        super().__init__(config.hidden_size, shape, shape.softmax_scale(config.rope_scaling),
                         bias=config.attention_bias, eps=config.rms_norm_eps)
        self.layer_index = layer_index

    def forward(self, x, rope_cos, rope_sin, mask, cache=None):
        if cache is None:
            return super().forward(x, rope_cos, rope_sin, mask)
        return cache.attend_latent(self, x, rope_cos, rope_sin, mask)


class Block(nn.Module):
    """One pre-norm transformer layer: attention then MLP, each added to the residual stream
    (Gemma normalises their outputs too, before adding them). ``kind``: how it attends. On
    a mixture-of-experts model's sparse layers the MLP is a :class:`~minillm.moe.MoE`."""

    def __init__(self, config: ModelConfig, layer_index: int, backend: str):
        super().__init__()
        d, sandwich = config.hidden_size, config.gemma_norms
        self.kind = config.attention_kinds()[layer_index]
        self.attn_norm = make_norm(config, d)
        self.attn = (LatentAttentionLayer(config, layer_index) if config.mla is not None
                     else Attention(config, layer_index, backend))
        self.attn_out_norm = make_norm(config, d) if sandwich else nn.Identity()
        self.mlp_norm = make_norm(config, d)
        self.mlp = MoE(**config.moe) if config.is_moe_layer(layer_index) else MLP(config)
        self.mlp_out_norm = make_norm(config, d) if sandwich else nn.Identity()

    def forward(self, x, rope_cos, rope_sin, mask, cache=None):
        x = x + self.attn_out_norm(self.attn(self.attn_norm(x), rope_cos, rope_sin, mask, cache))
        return x + self.mlp_out_norm(self.mlp(self.mlp_norm(x)))


def build_attention_mask(query_steps, key_steps, padding=None, window=None):
    """Who may attend to whom, as a bool tensor [batch or 1, 1, queries, keys].

    A query at time step q sees a key at step s when s <= q (causal), the slot is filled
    (s >= 0), s is not padding, and, with a sliding window, q - s < window. Every query
    also sees itself, so rows of left padding never become empty (their output is unused).
    """
    q, s = query_steps[:, None], key_steps[None, :]
    allowed = (s <= q) & (s >= 0)
    if window is not None:
        allowed &= (q - s) < window
    allowed = allowed[None]  # [1, queries, keys]
    if padding is not None:
        columns = key_steps.clamp(0, padding.shape[1] - 1)  # future slots: masked as causal
        allowed = allowed & padding[:, None, columns].bool()
    allowed = allowed | (s == q)
    return allowed[:, None]


class Transformer(nn.Module):
    """The whole decoder: ``forward(input_ids) -> logits`` [batch, seq, vocab]."""

    def __init__(self, config: ModelConfig, attn_backend: str = "sdpa"):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            Block(config, i, attn_backend) for i in range(config.num_layers))
        self.norm = make_norm(config, config.hidden_size)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.build_rope()
        self.attn_backend = attn_backend

    def build_rope(self) -> None:
        """(Re)compute the RoPE tables: ``rope`` and, with a local base (Gemma 3's sliding
        layers), ``local_rope``. They are buffers computed from the config, not weights: a
        model built on the meta device calls this once its weights are loaded."""
        config = self.config
        self.rope = RotaryEmbedding(config)
        self.local_rope = None if config.rope_local_theta is None else RotaryEmbedding(
            replace(config, rope_theta=config.rope_local_theta, rope_scaling=None))

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of activations and KV caches (the final norm's, as embeddings and linear
        layers may be stored compactly by the quantization chapters)."""
        return self.norm.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.norm.weight.device

    def set_attention_backend(self, name: str) -> Transformer:
        """Switch every layer to another attention backend (weights are untouched)."""
        backend = get_backend(name)
        for layer in self.layers:
            layer.attn.backend = backend
        self.attn_backend = name
        return self

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings, times the family's ``embedding_scale`` (Gemma: sqrt(hidden),
        rounded to the activation dtype as Hugging Face does)."""
        x = self.embed_tokens(token_ids)
        scale = self.config.embedding_scale
        return x if scale == 1.0 else x * torch.tensor(scale, dtype=x.dtype)

    def forward(self, input_ids: torch.Tensor, cache=None, attention_mask=None,
                last_only: bool = False) -> torch.Tensor:
        """Logits for ``input_ids`` [batch, seq].

        cache: a :mod:`minillm.kv_cache` cache; the new tokens are appended after its contents.
        attention_mask: [batch, steps] with 1 for real tokens and 0 for (left) padding,
            covering the cached steps and the new ones (the Hugging Face convention).
        last_only: compute logits for the last position only (all that decoding needs).
        """
        seq = input_ids.shape[1]
        inputs = self.layer_inputs(seq, input_ids.device, attention_mask, cache)
        x = self.run_layers(self.embed(input_ids), inputs, cache)
        if cache is not None:
            cache.advance(seq)
        return self.head(x[:, -1:] if last_only else x)

    def layer_inputs(self, seq_len: int, device: torch.device, attention_mask=None,
                     cache=None) -> LayerInputs:
        """RoPE tables and attention mask of each layer kind for ``seq_len`` new tokens.

        Without ``cache`` (and ``attention_mask``) the tokens are whole sequences: positions
        0..seq_len-1, a causal mask. Calibration, K/V fitting and pipeline stages run layers
        on such inputs. With a cache they follow its contents; ``attention_mask`` as in
        :meth:`forward`. A mask is None where it would hide nothing. A sliding-window cache
        narrows every kind's window to its own.
        """
        if cache is None:
            query_steps = key_steps = torch.arange(seq_len, device=device)
            cache_window, decode_needs_mask = None, False
        else:
            query_steps, key_steps = cache.steps(seq_len)
            cache_window, decode_needs_mask = cache.window, cache.decode_needs_mask
        positions = self._rope_positions(query_steps, attention_mask)
        inputs = {}
        for kind in self.layer_kinds():
            window = min((w for w in (kind.window, cache_window) if w is not None), default=None)
            if attention_mask is None and seq_len == 1 and not decode_needs_mask \
                    and window is None:
                mask = None  # one new token with no padding: it may see every cached key
            else:
                mask = build_attention_mask(query_steps, key_steps, attention_mask, window)
            inputs[kind] = (*self.rope_tables(kind, positions), mask)
        return inputs

    def attention_inputs(self, seq_len: int, device: torch.device, attention_mask=None,
                         cache=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(rope_cos, rope_sin, mask) of :meth:`layer_inputs`, for a model whose layers all
        attend alike (every Llama; not Gemma 3's mix of local and global layers)."""
        inputs = self.layer_inputs(seq_len, device, attention_mask, cache)
        if len(inputs) > 1:
            raise ValueError("this model's layers attend in different ways (sliding windows "
                             "or RoPE bases): use layer_inputs(), one (cos, sin, mask) per "
                             "layer kind, and run_layers()")
        return next(iter(inputs.values()))

    def forward_flat(self, token_ids: torch.Tensor, positions: torch.Tensor, cache,
                     logits_at: torch.Tensor | None = None) -> torch.Tensor:
        """The serving engine's forward: the tokens of many sequences in one flat list.

        token_ids, positions: [tokens], each token's id and its position in its sequence.
        cache: the paged pool bound to this pass's metadata
            (:class:`~minillm.engine.paged_cache.PagedAttention`, or a decode executor's
            view), which says which tokens belong to which sequence (no mask is built;
            the pool applies each layer's sliding window).
        logits_at: the rows whose logits are wanted (each sequence's last token; None: all)
            -> [rows, vocab].
        """
        x = self.final_hidden_flat(token_ids, positions, cache)
        return self.head(x if logits_at is None else x[logits_at])

    def final_hidden_flat(self, token_ids: torch.Tensor, positions: torch.Tensor,
                          cache) -> torch.Tensor:
        """:meth:`forward_flat` up to the final norm: every token's last hidden state
        [tokens, hidden] (what an EAGLE draft head reads: :mod:`minillm.draft_head`)."""
        x = self.embed(token_ids)[None]  # one "batch row" holding every token
        inputs = {kind: (*self.rope_tables(kind, positions[None]), None)
                  for kind in self.layer_kinds()}
        return self.run_layers(x, inputs, cache)[0]

    def layer_kinds(self) -> list[AttentionKind]:
        """The distinct ways this model's layers attend, in layer order."""
        return list(dict.fromkeys(layer.kind for layer in self.layers))

    def rope_tables(self, kind: AttentionKind, positions: torch.Tensor):
        """(cos, sin) of ``kind``'s RoPE for ``positions`` [batch, seq]."""
        return (self.local_rope if kind.local_rope else self.rope)(positions)

    def run_layers(self, x: torch.Tensor, inputs: LayerInputs, cache=None) -> torch.Tensor:
        """Every block in turn, each with its kind's inputs: the one place both forwards (and
        pipeline stages) share."""
        for layer in self.layers:
            x = layer(x, *inputs[layer.kind], cache)
        return x

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Final norm, then the LM head: hidden states -> logits."""
        return self.lm_head(self.norm(x))

    def _rope_positions(self, query_steps, attention_mask):
        """Token positions for RoPE: the step index, or, with left padding, steps minus padding."""
        if attention_mask is None:
            return query_steps[None]
        positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        return positions[:, query_steps]
