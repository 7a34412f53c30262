"""Sequence parallelism on top of tensor parallelism (Korthikanti et al. 2022, "Reducing
Activation Recomputation in Large Transformer Models", §4.2.2).

Tensor parallelism (:mod:`minillm.parallel.tensor`) splits the weights of attention and the
MLP, and with them their activations: each rank holds the q/k/v, scores and MLP hidden
states of its own heads and columns, 1/t of them. But between those two regions every rank
runs the *same* RMSNorms, residual adds (and, in training, dropouts) on the *whole*
sequence: their activations are replicated, t copies of the same [batch, seq, hidden]
tensors. In a training step, which keeps every activation for the backward pass, these
replicated regions become a large share of the memory.

These operations work on each token independently, so they split along the **sequence**
instead: rank r keeps tokens [r·s/t, (r+1)·s/t) of the residual stream and normalizes only
those. Attention (which mixes tokens) and the column-parallel layers need every token, so
the two regions meet through the conjugate pair the paper calls g and ḡ:

* **g** before attention and the MLP: an *all-gather* along the sequence rebuilds the whole
  normalized input on every rank (its backward is a reduce-scatter);
* **ḡ** after them: their output is a partial sum on each rank (row-parallel o_proj and
  down_proj), and a *reduce-scatter* along the sequence sums it and hands each rank only its
  own tokens (its backward is an all-gather) — in place of tensor parallelism's all-reduce.

No extra communication: an all-reduce *is* a reduce-scatter followed by an all-gather (that
is how the ring algorithm runs it). A ring all-reduce of an n-byte message sends
2(t−1)/t·n bytes per rank; a reduce-scatter or an all-gather sends (t−1)/t·n. Per block,
tensor parallelism runs 2 all-reduces, sequence parallelism 2 reduce-scatters and 2
all-gathers: the same 4(t−1)/t·n. The embedding's all-reduce becomes a reduce-scatter, and
the head needs one all-gather of the final norm's output (on local tokens) before the
vocabulary-parallel head: the total is again the same.

Attention sees the gathered whole sequence, so the RoPE tables and the causal mask that
:meth:`Transformer.forward` builds for the full sequence stay right, and a :class:`Block`
adds the reduce-scattered output (local tokens) to its local residual: the same shapes.

:func:`sequence_parallel` returns a model already transformed by :func:`tensor_parallel`
with its regions rewired (no hooks: each region is a module of its own);
``model(input_ids)`` keeps its signature and returns the full logits on every rank. It
applies to whole-sequence forwards (prefill, training), whose length splits evenly; a
one-token decode step with a KV cache has no sequence to split and is refused.
:func:`activation_bytes` measures what the paper is about: the bytes of the tensors a
forward keeps for the backward pass, per rank. One difference from the paper: the column-
parallel layers here keep the gathered (whole) input for their backward, where Megatron keeps
the local shard and all-gathers it again during the backward pass. Measured on SmolLM2, one
sequence of 96 tokens, 3 ranks: one process keeps 124.2 MiB, tensor parallelism 67.9 MiB per
rank, with sequence parallelism 50.7 MiB per rank (0.75 of tensor parallelism alone); and in
both cases the collectives of a forward send 29.2 MiB per rank.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn

from ..model import Transformer
from ..transform import copy_modules
from .layers import COLLECTIVES, RowParallelLinear, VocabParallelEmbedding


def all_gather_sequence(x: torch.Tensor) -> torch.Tensor:
    """[batch, s/t, ...] on each rank -> [batch, s, ...], the ranks' tokens in rank order,
    counted. The collective concatenates along dim 0, so the sequence moves there first; the
    result is made contiguous once (a linear layer flattens its input, and each of q, k and v
    would copy a strided view and keep its own copy for the backward pass)."""
    COLLECTIVES["all_gather_sequence"] += 1
    tokens_first = x.transpose(0, 1).contiguous()
    gathered = tokens_first.new_empty(
        (tokens_first.shape[0] * dist.get_world_size(), *tokens_first.shape[1:]))
    dist.all_gather_single(gathered, tokens_first)
    return gathered.transpose(0, 1).contiguous()


def reduce_scatter_sequence(x: torch.Tensor) -> torch.Tensor:
    """[batch, s, ...] partial sums on each rank -> this rank's tokens [batch, s/t, ...] of
    the sum over ranks, counted."""
    COLLECTIVES["reduce_scatter"] += 1
    tokens_first = x.transpose(0, 1).contiguous()
    local = tokens_first.new_empty(
        (tokens_first.shape[0] // dist.get_world_size(), *tokens_first.shape[1:]))
    dist.reduce_scatter_single(local, tokens_first)
    return local.transpose(0, 1)


def local_tokens(x: torch.Tensor) -> torch.Tensor:
    """This rank's tokens [batch, s/t, ...] of a tensor every rank holds whole."""
    part = x.shape[1] // dist.get_world_size()
    return x[:, dist.get_rank() * part:(dist.get_rank() + 1) * part]


class GatherSequence(torch.autograd.Function):
    """g: all-gather along the sequence; backward, reduce-scatter the gradient (every rank's
    computation on the whole sequence contributes to each token's gradient)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return all_gather_sequence(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return reduce_scatter_sequence(grad)


class ScatterSequence(torch.autograd.Function):
    """ḡ: reduce-scatter along the sequence; backward, all-gather the local gradients (each
    rank's partial sum fed every token)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return reduce_scatter_sequence(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return all_gather_sequence(grad)


class SequenceParallelRegion(nn.Module):
    """Attention or the MLP of a block between g and ḡ: the local tokens are gathered into
    the whole sequence (g), the module runs on it, and its row-parallel output layer
    reduce-scatters its partial sums back to local tokens (ḡ). A module every rank keeps
    whole (``shard_attention=False``) computes the complete output: each rank keeps its
    own tokens of it."""

    def __init__(self, module: nn.Module, replicated: bool):
        super().__init__()
        self.module, self.replicated = module, replicated

    def forward(self, x: torch.Tensor, *args) -> torch.Tensor:
        out = self.module(GatherSequence.apply(x), *args)
        return local_tokens(out) if self.replicated else out


class GatheredHead(nn.Module):
    """The vocabulary-parallel head, fed the whole sequence (an all-gather first)."""

    def __init__(self, head: nn.Module):
        super().__init__()
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(GatherSequence.apply(x))


def _region(module: nn.Module) -> SequenceParallelRegion:
    """``module`` (the copy's own) between g and ḡ: its row-parallel output layer, if any,
    reduce-scatters instead of all-reducing."""
    outputs = [layer for layer in module.children() if isinstance(layer, RowParallelLinear)]
    for layer in outputs:
        layer.reduce = ScatterSequence.apply
    return SequenceParallelRegion(module, replicated=not outputs)


class SequenceParallel(nn.Module):
    """A tensor-parallel model whose residual stream is split along the sequence
    (:func:`sequence_parallel`); ``model(input_ids)`` returns the full logits on every
    rank. It refuses, before any collective, a call it cannot split."""

    def __init__(self, model: Transformer):
        super().__init__()
        self.model = model

    @property
    def config(self):
        return self.model.config

    def forward(self, input_ids: torch.Tensor, cache=None, attention_mask=None,
                last_only: bool = False) -> torch.Tensor:
        seq, world = input_ids.shape[1], dist.get_world_size()
        if cache is not None:
            raise ValueError("sequence parallelism splits a whole sequence (prefill or "
                             "training); a decode step with a KV cache has no sequence to "
                             "split: decode with a tensor-parallel model without "
                             "sequence_parallel()")
        if last_only:
            raise ValueError("sequence parallelism computes every position's logits (the "
                             "last token lives on the last rank): call model(input_ids) and "
                             "take logits[:, -1:]")
        if seq % world:
            raise ValueError(f"sequence parallelism over {world} ranks splits the sequence "
                             f"into equal parts, but it has {seq} tokens: pad the prompt to "
                             f"a multiple of {world} or choose a world size that divides {seq}")
        return self.model(input_ids, attention_mask=attention_mask)


def sequence_parallel(model: Transformer) -> SequenceParallel:
    """``model`` (a :func:`tensor_parallel` rank's model, which is not changed) with its
    residual stream sharded along the sequence between its tensor-parallel regions (same
    process group). Per forward each rank runs 2L + 1 reduce-scatters (the embedding's and
    ḡ after attention and the MLP of each of L blocks), 2L + 1 all-gathers along the
    sequence (g before them, and one before the head) and the head's all-gather of logits:
    the bytes tensor parallelism moves. Attention kept whole (``shard_attention=False``)
    still gathers its input, then keeps its own tokens of the complete output: L + 1
    reduce-scatters. In training, each rank's gradient of a norm weight covers its own
    tokens: the sum over ranks is the whole one."""
    if isinstance(model, SequenceParallel):
        raise ValueError("this model is already sequence-parallel")
    if not isinstance(model.embed_tokens, VocabParallelEmbedding):
        raise ValueError("sequence_parallel() applies to a tensor-parallel model: call "
                         "tensor_parallel(model) first")
    split = copy_modules(model)
    split.embed_tokens.reduce = ScatterSequence.apply
    for block in split.layers:
        block.attn = _region(block.attn)
        block.mlp = _region(block.mlp)
    split.lm_head = GatheredHead(split.lm_head)
    return SequenceParallel(split)


@contextmanager
def _weights_requiring_grad(model: nn.Module):
    """Autograd on, and the floating-point weights requiring gradients as in training."""
    weights = [p for p in model.parameters() if p.is_floating_point() and not p.requires_grad]
    try:
        for weight in weights:
            weight.requires_grad_(True)
        with torch.enable_grad():
            yield
    finally:
        for weight in weights:
            weight.requires_grad_(False)


def activation_bytes(model: nn.Module, input_ids: torch.Tensor) -> int:
    """Bytes of the tensors a training forward of ``input_ids`` keeps for the backward pass
    on this rank: what autograd saves, each storage counted once, weights and buffers not."""
    weights = {t.untyped_storage().data_ptr()
               for t in [*model.parameters(), *model.buffers()]}
    saved = {}  # data pointer -> storage, held so that no address is reused meanwhile

    def remember(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in weights:
            saved[storage.data_ptr()] = storage
        return tensor

    with _weights_requiring_grad(model), \
            torch.autograd.graph.saved_tensors_hooks(remember, lambda tensor: tensor):
        model(input_ids)
    return sum(storage.nbytes() for storage in saved.values())
