"""A Llama-family decoder, written to be read top to bottom.

    tokens -> embedding -> N x Block -> RMSNorm -> lm_head -> logits
    Block:  x = x + Attention(RMSNorm(x));  x = x + MLP(RMSNorm(x))

Attention has separate query and key/value head counts, so MHA (equal counts), GQA
(fewer K/V heads) and MQA (one K/V head) are the same code. The score computation is
delegated to a backend from :mod:`minillm.attention`, chosen by name.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .attention import get_backend
from .config import ModelConfig
from .rope import RotaryEmbedding, apply_rotary


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


class MLP(nn.Module):
    """SwiGLU feed-forward (Shazeer 2020, eq. 6): down(silu(gate(x)) * up(x))."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        d, hidden, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.gate_proj = nn.Linear(d, hidden, bias=bias)
        self.up_proj = nn.Linear(d, hidden, bias=bias)
        self.down_proj = nn.Linear(hidden, d, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Attention(nn.Module):
    """Multi-head attention with ``num_kv_heads`` key/value heads shared by groups of queries."""

    def __init__(self, config: ModelConfig, layer_index: int, backend: str):
        super().__init__()
        d, hd, bias = config.hidden_size, config.head_dim, config.attention_bias
        self.num_heads, self.num_kv_heads, self.head_dim = (
            config.num_heads, config.num_kv_heads, config.head_dim)
        self.layer_index = layer_index
        self.q_proj = nn.Linear(d, config.num_heads * hd, bias=bias)
        self.k_proj = nn.Linear(d, config.num_kv_heads * hd, bias=bias)
        self.v_proj = nn.Linear(d, config.num_kv_heads * hd, bias=bias)
        self.o_proj = nn.Linear(config.num_heads * hd, d, bias=bias)
        self.backend = get_backend(backend)

    def _split_heads(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        batch, seq, _ = x.shape
        return x.view(batch, seq, heads, self.head_dim).transpose(1, 2)

    def forward(self, x, rope_cos, rope_sin, mask, cache=None):
        batch, seq, _ = x.shape
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q, k, v = (self._split_heads(q, self.num_heads), self._split_heads(k, self.num_kv_heads),
                   self._split_heads(v, self.num_kv_heads))
        q, k = apply_rotary(q, rope_cos, rope_sin), apply_rotary(k, rope_cos, rope_sin)
        if cache is None:
            out = self.backend(q, k, v, mask)  # [batch, heads, seq, head_dim]
        else:  # the cache stores k, v and attends over every key the queries may see
            out = cache.attend(self.layer_index, q, k, v, mask, self.backend)
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, -1))


class Block(nn.Module):
    """One pre-norm transformer layer: attention then MLP, each added to the residual stream."""

    def __init__(self, config: ModelConfig, layer_index: int, backend: str):
        super().__init__()
        self.attn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attn = Attention(config, layer_index, backend)
        self.mlp_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, rope_cos, rope_sin, mask, cache=None):
        x = x + self.attn(self.attn_norm(x), rope_cos, rope_sin, mask, cache)
        return x + self.mlp(self.mlp_norm(x))


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
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rope = RotaryEmbedding(config)
        self.attn_backend = attn_backend

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

    def forward(self, input_ids: torch.Tensor, cache=None, attention_mask=None,
                last_only: bool = False) -> torch.Tensor:
        """Logits for ``input_ids`` [batch, seq].

        cache: a :mod:`minillm.kv_cache` cache; the new tokens are appended after its contents.
        attention_mask: [batch, steps] with 1 for real tokens and 0 for (left) padding,
            covering the cached steps and the new ones (the Hugging Face convention).
        last_only: compute logits for the last position only (all that decoding needs).
        """
        seq = input_ids.shape[1]
        rope_cos, rope_sin, mask = self.attention_inputs(seq, input_ids.device, attention_mask,
                                                         cache)
        x = self.run_layers(self.embed_tokens(input_ids), rope_cos, rope_sin, mask, cache)
        if cache is not None:
            cache.advance(seq)
        return self.head(x[:, -1:] if last_only else x)

    def attention_inputs(self, seq_len: int, device: torch.device, attention_mask=None,
                         cache=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """RoPE tables and attention mask for ``seq_len`` new tokens: (rope_cos, rope_sin, mask).

        Without ``cache`` (and ``attention_mask``) the tokens are whole sequences: positions
        0..seq_len-1, a causal mask. Calibration, K/V fitting and pipeline stages run layers
        on such inputs. With a cache they follow its contents; ``attention_mask`` as in
        :meth:`forward`. The mask is None where it would hide nothing.
        """
        if cache is None:
            query_steps = key_steps = torch.arange(seq_len, device=device)
            window, decode_needs_mask = None, False
        else:
            query_steps, key_steps = cache.steps(seq_len)
            window, decode_needs_mask = cache.window, cache.decode_needs_mask
        rope_cos, rope_sin = self.rope(self._rope_positions(query_steps, attention_mask))
        if attention_mask is None and seq_len == 1 and not decode_needs_mask:
            mask = None  # one new token with no padding: it may see every cached key
        else:
            mask = build_attention_mask(query_steps, key_steps, attention_mask, window)
        return rope_cos, rope_sin, mask

    def forward_flat(self, token_ids: torch.Tensor, positions: torch.Tensor, cache,
                     logits_at: torch.Tensor | None = None) -> torch.Tensor:
        """The serving engine's forward: the tokens of many sequences in one flat list.

        token_ids, positions: [tokens], each token's id and its position in its sequence.
        cache: the paged pool bound to this pass's metadata
            (:class:`~minillm.engine.paged_cache.PagedAttention`, or a decode executor's
            view), which says which tokens belong to which sequence (no mask is built).
        logits_at: the rows whose logits are wanted (each sequence's last token; None: all)
            -> [rows, vocab].
        """
        x = self.final_hidden_flat(token_ids, positions, cache)
        return self.head(x if logits_at is None else x[logits_at])

    def final_hidden_flat(self, token_ids: torch.Tensor, positions: torch.Tensor,
                          cache) -> torch.Tensor:
        """:meth:`forward_flat` up to the final norm: every token's last hidden state
        [tokens, hidden] (what an EAGLE draft head reads: :mod:`minillm.draft_head`)."""
        x = self.embed_tokens(token_ids)[None]  # one "batch row" holding every token
        rope_cos, rope_sin = self.rope(positions[None])
        return self.run_layers(x, rope_cos, rope_sin, None, cache)[0]

    def run_layers(self, x: torch.Tensor, rope_cos, rope_sin, mask, cache=None) -> torch.Tensor:
        """Every block in turn: the one place both forwards (and pipeline stages) share."""
        for layer in self.layers:
            x = layer(x, rope_cos, rope_sin, mask, cache)
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
