"""Changing how many key/value heads a trained model has: MHA <-> GQA <-> MQA.

With ``num_kv_heads`` key/value heads shared by ``num_heads`` query heads, the KV cache
per token is ``2 * layers * num_kv_heads * head_dim`` values: MQA (one K/V head) and GQA
(a few) shrink it by ``num_heads / num_kv_heads`` compared with MHA.

* :func:`expand_kv_heads` turns a GQA model into an exactly equivalent MHA model by
  copying each K/V head's projection for every query head of its group: same logits,
  more cache. It shows GQA *is* MHA with tied K/V heads.
* :func:`pool_kv_heads` goes the other way with the recipe of the GQA paper (Ainslie et
  al. 2023, sec. 2.1): the new K (and V) projection of a group is the *mean* of the
  projections of the heads it merges. The model then needs "uptraining" to recover; here
  we measure how much it loses without it.
* :func:`merge_kv_heads` merges heads without that collapse, in closed form: each group's
  shared head is the one that reproduces its heads best on real text (PCA), and the map
  back to each old head is folded into that head's queries and output projection.
* :func:`fit_kv_projections` is a cheap stand-in for uptraining: it trains only the
  shared K/V projections, one layer at a time, to reproduce the original model's
  attention outputs on real text.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace

import torch
from torch import nn
from tqdm.auto import tqdm

from .model import Attention, Transformer


def regroup_kv_projection(proj: nn.Linear, old_heads: int, new_heads: int,
                          head_dim: int) -> nn.Linear:
    """Rows of a K or V projection, [old_heads * head_dim, hidden] -> [new_heads * ...]."""
    weight = proj.weight.detach().view(old_heads, head_dim, -1)
    if new_heads > old_heads:
        weight = weight.repeat_interleave(new_heads // old_heads, dim=0)
    else:
        weight = weight.view(new_heads, old_heads // new_heads, head_dim, -1).mean(dim=1)
    bias = None
    if proj.bias is not None:
        b = proj.bias.detach().view(old_heads, head_dim)
        b = (b.repeat_interleave(new_heads // old_heads, 0) if new_heads > old_heads
             else b.view(new_heads, -1, head_dim).mean(1))
        bias = b.reshape(-1)
    new = nn.Linear(weight.shape[-1], new_heads * head_dim, bias=bias is not None,
                    dtype=weight.dtype, device=weight.device)
    with torch.no_grad():
        new.weight.copy_(weight.reshape(new_heads * head_dim, -1))
        if bias is not None:
            new.bias.copy_(bias)
    return new


def with_kv_heads(model: Transformer, num_kv_heads: int) -> Transformer:
    """A copy of ``model`` with ``num_kv_heads`` K/V heads (more: exact copies; fewer: means)."""
    config = model.config
    old = config.num_kv_heads
    if config.num_heads % num_kv_heads or (old % num_kv_heads and num_kv_heads % old):
        raise ValueError(
            f"cannot go from {old} to {num_kv_heads} K/V heads with {config.num_heads} query "
            "heads: the new count must divide the query heads, and the old count must "
            "divide it or be divided by it.")
    new_model = copy.deepcopy(model)
    new_model.config = replace(config, num_kv_heads=num_kv_heads)
    for layer in new_model.layers:
        attn = layer.attn
        for name in ("k_proj", "v_proj"):
            setattr(attn, name, regroup_kv_projection(getattr(attn, name), old, num_kv_heads,
                                                      config.head_dim))
        attn.num_kv_heads = num_kv_heads
    return new_model


def expand_kv_heads(model: Transformer) -> Transformer:
    """GQA/MQA -> MHA, exactly: every query head gets its own copy of its group's K/V head."""
    return with_kv_heads(model, model.config.num_heads)


def pool_kv_heads(model: Transformer, num_kv_heads: int) -> Transformer:
    """Merge K/V heads by mean-pooling their projections (GQA paper, sec. 2.1)."""
    if num_kv_heads > model.config.num_kv_heads:
        raise ValueError("pooling reduces the number of K/V heads; use expand_kv_heads to add")
    return with_kv_heads(model, num_kv_heads)



@torch.no_grad()
def attention_input_grams(model: Transformer, windows: torch.Tensor) -> list[torch.Tensor]:
    """E[x xᵀ] (float64, [hidden, hidden]) of what enters each layer's attention (after its
    RMSNorm), over every token of ``windows`` [num_windows, seq]."""
    grams = [torch.zeros(model.config.hidden_size, model.config.hidden_size,
                         dtype=torch.float64) for _ in model.layers]

    def accumulate(i):
        def hook(module, args):
            x = args[0].reshape(-1, args[0].shape[-1]).double()
            grams[i] += x.T @ x / windows.numel()
        return hook

    handles = [layer.attn.register_forward_pre_hook(accumulate(i))
               for i, layer in enumerate(model.layers)]
    try:
        model(windows)
    finally:
        for handle in handles:
            handle.remove()
    return grams


@torch.no_grad()
def merge_kv_heads(model: Transformer, num_kv_heads: int, windows: torch.Tensor) -> Transformer:
    """Merge each group of K/V heads into the one shared head that keeps the most of them.

    Mean-pooling fails on a trained model because its heads' keys and values live in
    unrelated bases: the mean of unrelated vectors resembles none of them. Instead, from
    the statistics of real text (``windows``, [num_windows, seq]; never evaluation text)
    we pick for each group the shared head that best reproduces all of its heads (PCA),
    and fold the map from the shared head back to each old head into the weights that
    read it, which stay per query head:

    * **values**: the shared value is the top ``head_dim`` principal directions of the
      group's stacked values, v ≈ U z. A query head that read v_g now reads U_g z, so its
      columns of ``o_proj`` become O_h U_g.
    * **keys**: RoPE rotates each pair of coordinates (j, j + head_dim/2) of q and k by a
      position-dependent angle: as a complex number, the pair is multiplied by e^{iθt}. A
      complex *scalar* commutes with that rotation, so per pair we keep the top principal
      component z of the group's complex key coordinates, k_g ≈ u_g z, and multiply the
      matching pair of every query of old head g by conj(u_g): q·k_g ≈ (conj(u_g) q)·z at
      every position.

    No training: one forward pass over ``windows`` and eigen-decompositions.
    """
    config = model.config
    if config.attention_bias:
        raise ValueError("merge_kv_heads does not handle attention biases")
    merged = with_kv_heads(model, num_kv_heads)  # the new shapes; weights replaced below
    grams = attention_input_grams(model, windows)
    for old, new, gram in zip(model.layers, merged.layers, grams, strict=True):
        _merge_layer(old.attn, new.attn, gram, num_kv_heads)
    return merged


def _merge_layer(old: Attention, new: Attention, gram: torch.Tensor, groups: int) -> None:
    """Write the merged K/V projections and the adjusted Q/O projections into ``new``."""
    heads, kv_heads, d = old.num_heads, old.num_kv_heads, old.head_dim
    per_group, queries_per_kv = kv_heads // groups, heads // kv_heads
    hidden, pairs = gram.shape[0], d // 2

    # values: [groups, per_group * d, hidden] -> top-d principal subspace U of each group
    wv = old.v_proj.weight.double().view(groups, per_group * d, hidden)
    u = torch.linalg.eigh(wv @ gram @ wv.transpose(1, 2)).eigenvectors[..., -d:]
    wo = old.o_proj.weight.double().view(hidden, groups, per_group, queries_per_kv, d)
    wo = torch.einsum("ogrqd,grde->ogrqe", wo, u.view(groups, per_group, d, d))

    # keys: each coordinate pair as a complex number, [groups, per_group, pairs, hidden]
    wk = old.k_proj.weight.double().view(groups, per_group, d, hidden)
    keys = torch.complex(wk[:, :, :pairs], wk[:, :, pairs:])
    covariance = torch.einsum("grpx,xy,gspy->gprs", keys, gram.to(keys.dtype), keys.conj())
    top = torch.linalg.eigh(covariance).eigenvectors[..., -1]  # [groups, pairs, per_group]
    shared = torch.einsum("gpr,grpx->gpx", top.conj(), keys)
    wq = old.q_proj.weight.double().view(groups, per_group, queries_per_kv, d, hidden)
    queries = torch.complex(wq[:, :, :, :pairs], wq[:, :, :, pairs:])
    queries = queries * top.conj().transpose(1, 2)[:, :, None, :, None]

    for proj, weight in [(new.v_proj, u.transpose(1, 2) @ wv),
                         (new.o_proj, wo),
                         (new.k_proj, torch.cat([shared.real, shared.imag], dim=1)),
                         (new.q_proj, torch.cat([queries.real, queries.imag], dim=3))]:
        proj.weight.copy_(weight.reshape(proj.weight.shape))

@dataclass(frozen=True)
class FitError:
    """A layer's relative attention-output error, ||student - teacher||² / ||teacher||²."""

    before: float
    after: float


def fit_kv_projections(student: Transformer, teacher: Transformer, windows: torch.Tensor,
                       steps: int = 40, lr: float = 1e-2, progress: bool = True
                       ) -> list[FitError]:
    """Train ``student``'s K and V projections so each layer's attention matches ``teacher``'s.

    ``student`` is ``teacher`` with fewer K/V heads (:func:`pool_kv_heads`); ``windows`` is
    real text, a LongTensor [num_windows, seq] (never the evaluation text). Layer by layer,
    bottom up, Adam minimises the relative squared error between the student's attention
    output on the hidden states the *student* produces (errors of the layers below
    included) and the teacher's attention output on the teacher's own hidden states. Every
    other weight stays fixed, and the student is left with ``requires_grad=False``.

    The GQA paper (Ainslie et al. 2023, sec. 2.1) instead continues pre-training the whole
    pooled model for ~5% of the original steps; fitting layer by layer is what fits in
    minutes on a CPU. Returns each layer's error before and after its fit.
    """
    *rope, mask = teacher.attention_inputs(windows.shape[1], windows.device)
    student.requires_grad_(False)
    with torch.no_grad():
        student_hidden = student.embed_tokens(windows)
        teacher_hidden = teacher.embed_tokens(windows)
    errors = []
    layers = zip(student.layers, teacher.layers, strict=True)
    for s_block, t_block in tqdm(layers, total=len(teacher.layers), desc="fit K/V",
                                 disable=not progress):
        with torch.no_grad():
            inputs = s_block.attn_norm(student_hidden)
            target = t_block.attn(t_block.attn_norm(teacher_hidden), *rope, mask)
        errors.append(_fit_layer(s_block.attn, inputs, target, rope, mask, steps, lr))
        with torch.no_grad():
            student_hidden = s_block(student_hidden, *rope, mask)
            teacher_hidden = t_block(teacher_hidden, *rope, mask)
    return errors


def _fit_layer(attn: Attention, inputs, target, rope, mask, steps: int, lr: float) -> FitError:
    """Adam on one attention layer's K/V projections: ``attn(inputs)`` -> ``target``."""
    weights = [attn.k_proj.weight, attn.v_proj.weight]
    optimizer = torch.optim.Adam(weights, lr=lr)
    scale = target.pow(2).mean()

    def error():
        return (attn(inputs, *rope, mask) - target).pow(2).mean() / scale

    with torch.no_grad():
        before = error().item()
    for weight in weights:
        weight.requires_grad_(True)
    for _ in range(steps):
        optimizer.zero_grad()
        loss = error()
        loss.backward()
        optimizer.step()
    for weight in weights:
        weight.requires_grad_(False)
        weight.grad = None
    with torch.no_grad():
        return FitError(before, error().item())
