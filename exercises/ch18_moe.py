# Generated from solutions/ch18_moe.py by `python -m minillm.grading.exercises`.
# Fill in the parts that raise NotImplementedError; do not edit the rest.
"""Chapter 18: mixture of experts — the top-k router and the grouped expert dispatch.

The lab is :func:`route_top_k` and :func:`grouped_expert_forward`, the two halves of the
library's MoE layer (:mod:`minillm.moe`), and DeepSeek-V3's router
(:func:`route_sigmoid_grouped`). The rest of this file is given: it cuts each
dense SwiGLU MLP of a model into experts (:class:`SlicedMoE`; with every expert active
and weight 1 it is exactly the dense MLP, the observation behind MoEfication, Zhang et al.
2022), routes tokens with your router and runs them through your dispatch, so the engine
can serve SmolLM2 with your MoE layers (:func:`moefied`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minillm import moe
from minillm.sampling import SamplingParams
from minillm.serve import LLM
from minillm.transform import copy_modules


def route_top_k(logits: torch.Tensor, k: int, normalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Exercise 18.1: the softmax top-k router (Switch, Mixtral, Qwen3-MoE, OLMoE).

    logits: router scores [tokens, num_experts] (any float dtype); 1 <= k <= num_experts.
    Returns (expert_ids, weights), both [tokens, k]:
    * expert_ids (int64): each token's k experts with the largest probability
      p = softmax(logits) over ALL experts (computed in float32), largest first; experts
      with equal probability are ordered by expert id, the lower first (so ties at the
      k-th place go to the lower id);
    * weights (float32): p of those experts, in the same order; when ``normalize`` is
      true, divided by their sum so each row sums to 1 (Qwen3-MoE's ``norm_topk_prob``).
    Called by the MoE layer for every token of every step; the library's version is
    :func:`minillm.moe.softmax_routing`.
    Hint: Mixtral eq. 2 takes the softmax over the top-k logits: the same weights only
    when they are renormalised. ``torch.topk`` does not promise an order for ties.
    """
    raise NotImplementedError("Exercise 18.1: the softmax top-k router (Switch, Mixtral, Qwen3-MoE, OLMoE)")


def grouped_expert_forward(x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor,
                           gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """Exercise 18.2: the MoE layer's output from its routing, experts grouped.

    x: [tokens, hidden] (float32 or float64); expert_ids: int64 [tokens, k], the k
    distinct experts of each token; weights: [tokens, k] (float32), the weight of each.
    gate_up: [num_experts, 2 * inter, hidden], expert e's gate rows then its up rows;
    down: [num_experts, hidden, inter]. Expert e is the SwiGLU MLP
    E_e(v) = down[e] @ (silu(G_e v) * (U_e v)), with G_e = gate_up[e, :inter] and
    U_e = gate_up[e, inter:].
    Returns y [tokens, hidden] in x's dtype, y[t] = Σ_j weights[t, j] · E_{expert_ids[t, j]}(x[t]).
    Work per expert, not per token: each expert that some token chose multiplies ALL its
    tokens' rows at once (at most one product per projection per such expert, however many
    tokens), and an expert no token chose is never read (its weights may be anything,
    even NaN). Experts may get very different numbers of tokens, or none.
    The library's version is :func:`minillm.moe.dispatch`.
    Hint: sort the tokens × k assignments by expert (``torch.argsort(..., stable=True)``),
    count them (``torch.bincount``), split, run each group, and add the weighted rows back
    to their tokens (``index_add_``). Shazeer et al. 2017 §3.1; the notebook's section 3.
    """
    raise NotImplementedError("Exercise 18.2: the MoE layer's output from its routing, experts grouped")


def route_sigmoid_grouped(logits: torch.Tensor, k: int, bias: torch.Tensor, num_groups: int,
                          top_groups: int, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Exercise 18.3: DeepSeek-V3's router — sigmoid scores, a load-balancing bias that
    steers the choice but not the weights, and group-limited selection.

    logits: [tokens, E] (E divisible by num_groups, E / num_groups >= 2); bias: [E]
    float32; 1 <= top_groups <= num_groups; k <= top_groups * E / num_groups.
    With s = sigmoid(logits) (float32) and c = s + bias:
    1. the experts form num_groups groups of consecutive ids; a group's score is the sum
       of the two largest c in it; each token keeps its top_groups groups (largest first,
       ties to the lower group id);
    2. among the experts of the kept groups, the k with the largest c (largest first,
       ties to the lower expert id) are the token's expert_ids [tokens, k] (int64);
    3. weights [tokens, k] (float32) are s (not c) of those experts, divided by their
       sum (+ 1e-20), times ``scale`` (DeepSeek-V3's routed_scaling_factor).
    The library's version is :func:`minillm.moe.sigmoid_routing` with normalize=True.
    Hint: the DeepSeek-V3 report, §2.1.2 ("auxiliary-loss-free load balancing"):
    the bias only decides which experts a token goes to.
    """
    raise NotImplementedError("Exercise 18.3: DeepSeek-V3's router — sigmoid scores, a load-balancing bias that")


class SlicedMoE(nn.Module):
    """A dense SwiGLU MLP cut into ``num_experts`` experts along its intermediate width,
    each token sent through ``top_k`` of them with weight 1 (all of them: the dense MLP).

    The router is an oracle: its logits are the norms of each slice's gate activations,
    which a trained router would predict from x at a fraction of the cost. ``route`` and
    ``dispatch`` are your functions or the library's (same contracts)."""

    def __init__(self, mlp: nn.Module, num_experts: int, top_k: int, route=route_top_k,
                 dispatch=grouped_expert_forward):
        super().__init__()
        inter, hidden = mlp.gate_proj.weight.shape
        if inter % num_experts:
            raise ValueError(f"the MLP's width {inter} does not split into {num_experts} experts")
        slices = num_experts, inter // num_experts, hidden
        gate, up = mlp.gate_proj.weight.view(slices), mlp.up_proj.weight.view(slices)
        self.gate_up = torch.cat([gate, up], dim=1)  # [E, 2 * inter / E, hidden]
        self.down = mlp.down_proj.weight.view(hidden, num_experts, -1).transpose(0, 1).contiguous()
        self.gate_rows, self.top_k, self.route, self.dispatch = gate, top_k, route, dispatch
        self.experts_read: list[int] = []  # distinct experts each call read

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        logits = F.silu(torch.einsum("th,eih->tei", flat, self.gate_rows)).norm(dim=-1)
        ids, _ = self.route(logits, self.top_k, False)
        self.experts_read.append(int(torch.unique(ids).numel()))
        ones = torch.ones(ids.shape, dtype=torch.float32)
        return self.dispatch(flat, ids, ones, self.gate_up, self.down).reshape(x.shape)


def moefied(model: nn.Module, num_experts: int, top_k: int, route=route_top_k,
            dispatch=grouped_expert_forward) -> nn.Module:
    """A copy of ``model`` (left as it is) whose every block's MLP is a :class:`SlicedMoE`."""
    sliced = copy_modules(model)
    for index, block in enumerate(model.layers):
        sliced.layers[index].mlp = SlicedMoE(block.mlp, num_experts, top_k, route, dispatch)
    return sliced


def library_moefied(model: nn.Module, num_experts: int, top_k: int) -> nn.Module:
    """:func:`moefied` with the library's router and dispatch."""
    return moefied(model, num_experts, top_k, moe.softmax_routing, moe.dispatch)


def engine_side_by_side(model: nn.Module, tokenizer, prompts: list[str], top_ks=(8, 4),
                        num_experts: int = 8, max_tokens: int = 8) -> list[dict]:
    """For each k: greedy text of the engine running ``model`` cut into ``num_experts``
    experts, top k, with your router and dispatch and with the library's; whether the
    tokens agree, and the experts a decode step read per layer (mean). Prints a line
    each and returns the rows."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0)
    rows = []
    for k in top_ks:
        runs = []
        for make in (moefied, library_moefied):
            llm = LLM(make(model, num_experts, k), tokenizer=tokenizer, executor="eager",
                      num_blocks=32)
            outputs = llm.generate(prompts, params, progress=False)
            reads = [n for block in llm.model.layers for n in block.mlp.experts_read[1:]]
            runs.append(([o.tokens for o in outputs], [o.text for o in outputs], reads))
        (yours, text, reads), (library, _, _) = runs
        rows.append(dict(k=k, same_tokens=yours == library, text=text,
                         experts_read=sum(reads) / max(1, len(reads))))
        print(f"top {k} of {num_experts}: your tokens {'=' if yours == library else '!='} "
              f"the library's; a decode step reads {rows[-1]['experts_read']:.1f} of "
              f"{num_experts} experts per layer")
        for line in text:
            print(f"    {line!r}")
    return rows
