"""An EAGLE-style draft head: one decoder block over the target's own hidden states.

A draft model re-reads the whole context with its own layers; the target has already
done that work, and its last hidden state f_t (before the final norm) is what its head
turns into the next token. EAGLE (Li et al. 2024) guesses from it: one decoder block, of
the target's shape, over

    x_t = fc([f_{t-1} ; e(tok_t)])          (fc: 2·hidden -> hidden; e: the target's embedding)
    g_t = Block(x_t)                        (attending over the head's earlier positions)
    q(tok_{t+1}) = softmax(out(norm(g_t)))  (over K tokens only)

and g_t is the head's guess of f_t: the next guess feeds it back as the feature,
[g_t ; e(guess)], so a chain of γ guesses costs γ passes of one block (EAGLE-3, Li et al.
2025, trains that way too: :mod:`.train`).

Its output layer covers only ``vocab``, the K tokens the target emits most often
(FR-Spec, Zhao et al. 2025: a quarter of the head's compute for ~all of its accepted
tokens, :mod:`.vocab`). A guess is drawn from those K rows and mapped through ``vocab``,
so a token outside can never be proposed; :meth:`DraftHead.proposal` spreads the K
probabilities over the full vocabulary (zero elsewhere), which is what rejection sampling
needs to stay exactly lossless (:func:`minillm.speculative.verify`).

The embedding is the target's, passed in by the caller (never stored twice).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig
from ..model import Block, RMSNorm, Transformer
from ..rope import RotaryEmbedding, apply_rotary
from ..sampling import SamplingParams
from ..speculative import probabilities

KeyValues = tuple[torch.Tensor, torch.Tensor]  # keys, values [kv_heads, positions, head_dim]


class DraftHead(nn.Module):
    """fc over [feature ; embedding], one :class:`~minillm.model.Block`, a final norm and
    an output layer over the K tokens of ``vocab`` (target token ids, [K])."""

    def __init__(self, config: ModelConfig, vocab: torch.Tensor):
        super().__init__()
        if vocab.dim() != 1 or not len(vocab):
            raise ValueError("vocab must be a non-empty 1-D tensor of target token ids")
        if int(vocab.min()) < 0 or int(vocab.max()) >= config.vocab_size:
            raise ValueError(f"vocab holds ids outside the target's 0..{config.vocab_size - 1}")
        if len(set(vocab.tolist())) != len(vocab):
            raise ValueError("vocab holds a token id twice")
        if differences := config.differences_from_llama():
            raise ValueError(f"a draft head is one Llama block; this target has "
                             f"{', '.join(differences)}: train heads for Llama-family targets")
        self.config = config
        hidden = config.hidden_size
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.block = Block(config, 0, "sdpa")
        self.norm = RMSNorm(hidden, config.rms_norm_eps)
        self.out = nn.Linear(hidden, len(vocab), bias=False)
        self.register_buffer("vocab", vocab.long().clone())
        self.rope = RotaryEmbedding(config)

    @classmethod
    def from_target(cls, target: Transformer, vocab: torch.Tensor) -> DraftHead:
        """A head that starts where the target ends: its block a copy of the target's last,
        its norm and output rows the target's (the ``vocab`` rows of lm_head), and fc passing
        the feature through (the embedding half starts small): before training it guesses
        what the target's last block, run once more, would say."""
        head = cls(target.config, vocab)
        head.block.load_state_dict(target.layers[-1].state_dict())
        hidden = target.config.hidden_size
        with torch.no_grad():
            head.norm.weight.copy_(target.norm.weight.float())
            head.out.weight.copy_(target.lm_head.weight.float()[head.vocab])
            head.fc.weight.zero_()
            head.fc.weight[:, :hidden] = torch.eye(hidden)
            head.fc.weight[:, hidden:].normal_(std=0.02 / hidden ** 0.5)
        return head

    @property
    def num_tokens(self) -> int:
        """K: the tokens the head can propose."""
        return len(self.vocab)

    def check_target(self, target: Transformer) -> None:
        """Refuse a target this head was not made for (hidden size, vocabulary, heads)."""
        mine, theirs = self.config, target.config
        fields = ("hidden_size", "vocab_size", "num_heads", "num_kv_heads", "head_dim")
        wrong = [f"{f} {getattr(mine, f)} vs the target's {getattr(theirs, f)}" for f in fields
                 if getattr(mine, f) != getattr(theirs, f)]
        if wrong:
            raise ValueError(f"this draft head was made for another model ({'; '.join(wrong)}): "
                             "train one for this target (minillm train-draft-head)")

    # -- the block, in two halves, so training and serving assemble keys their own way ----

    def project(self, features: torch.Tensor, embeddings: torch.Tensor,
                positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """x = fc([features ; embeddings]) and its rotated queries, keys and values:
        [..., T, hidden] (leading dims alike) -> x, q [..., heads, T, hd], k, v [..., kv, T, hd]."""
        x = self.fc(torch.cat([features, embeddings], dim=-1))
        attn = self.block.attn
        normed = self.block.attn_norm(x)
        cos, sin = self.rope(positions if positions.dim() > 1 else positions[None])
        cos, sin = (cos, sin) if positions.dim() > 1 else (cos[0], sin[0])
        q, k, v = (self._heads(proj(normed), n) for proj, n in
                   ((attn.q_proj, attn.num_heads), (attn.k_proj, attn.num_kv_heads),
                    (attn.v_proj, attn.num_kv_heads)))
        return x, apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v

    def finish(self, x: torch.Tensor, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
               mask: torch.Tensor | None) -> torch.Tensor:
        """The block's rest: attention of q over keys/values (``mask``: True = may see),
        o_proj and the MLP on the residual stream -> g, the head's feature [..., T, hidden]."""
        group = q.shape[-3] // keys.shape[-3]
        keys, values = (t.repeat_interleave(group, dim=-3) for t in (keys, values))
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        x = x + self.block.attn.o_proj(out.transpose(-3, -2).flatten(-2))
        return x + self.block.mlp(self.block.mlp_norm(x))

    def logits(self, g: torch.Tensor) -> torch.Tensor:
        """The head's logits over its K tokens: [..., hidden] -> [..., K]."""
        return self.out(self.norm(g))

    def _heads(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        return x.unflatten(-1, (heads, self.config.head_dim)).transpose(-3, -2)

    # -- serving -------------------------------------------------------------------------

    def extend(self, features: torch.Tensor, embeddings: torch.Tensor, positions: torch.Tensor,
               past: KeyValues | None) -> tuple[torch.Tensor, KeyValues]:
        """One sequence's next positions [T] after its ``past`` keys and values: -> the head's
        features g [T, hidden] and the keys and values with the new ones appended."""
        x, q, k, v = self.project(features, embeddings, positions)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=-2), torch.cat([past[1], v], dim=-2)
        count, total = q.shape[-2], k.shape[-2]
        mask = None if count == 1 else torch.ones(count, total, dtype=torch.bool).tril(
            total - count)
        return self.finish(x, q, k, v, mask), (k, v)

    def proposal(self, logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
        """The distribution a guess is drawn from, over the target's whole vocabulary:
        ``params`` applied to the K logits placed at their token ids, -inf elsewhere, so
        every token outside ``vocab`` has probability exactly 0. [K] -> [vocab]."""
        full = logits.new_full((self.config.vocab_size,), float("-inf"))
        full[self.vocab] = logits.float()
        return probabilities(full, params)
