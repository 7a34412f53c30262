"""A mixture-of-experts feed-forward layer: a router picks k of E SwiGLU experts per token.

The sparsely-gated layer (Shazeer et al. 2017, eq. 1) replaces one MLP by E of them and
a gate G: y = Σ_e G(x)_e · E_e(x), where G is zero for all but k experts, so a token
pays for k experts while the layer holds E of them. Here each expert is the SwiGLU MLP
E_e(x) = down_e(silu(gate_e x) ⊙ up_e x) and G comes from router logits s = W_r x:

* softmax scoring (Switch, Fedus et al. 2021, eq. 1-2; Mixtral, Jiang et al. 2024, eq. 2;
  Qwen3-MoE, OLMoE): p = softmax(s) over all E, keep the top k of p, and, when
  ``norm_topk_prob``, renormalise them to sum to 1 (Mixtral's softmax over the top-k
  logits is the same thing);
* sigmoid scoring (DeepSeek-V3, Liu et al. 2024, §2.1.2): p = σ(s); the top k are
  chosen on p + b, a per-expert bias that balances load (without an auxiliary loss),
  optionally only inside the ``top_groups`` best of ``num_groups`` expert groups; the
  weights are the unbiased p of the chosen experts, renormalised, times
  ``routed_scaling_factor``.

Optional shared experts (DeepSeekMoE, Dai et al. 2024) form one dense SwiGLU MLP that
every token goes through: y = shared(x) + Σ_e G(x)_e E_e(x); Qwen2-MoE
scales shared(x) by a sigmoid gate σ(w_g x).

The dispatch is grouped, not per token: the (token, expert) assignments are sorted by
expert, each active expert multiplies all its rows at once (one matmul per projection),
and the weighted rows are added back to their tokens. A step reads only the experts its
tokens chose (:func:`expert_bytes_read` counts them against dense MLPs).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .moe_checkpoint import moe_arguments

SCORINGS = ("softmax", "sigmoid")


def top_k_stable(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices [tokens, k] of each row's k largest scores, largest first; equal scores
    go to the lower index (a stable sort: torch.topk leaves ties unspecified)."""
    return torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :k]


def softmax_routing(logits: torch.Tensor, k: int, normalize: bool):
    """Switch/Mixtral/Qwen3-MoE routing: (expert ids [T, k], weights [T, k], float32) from
    router logits [T, E]: softmax over all experts, then the top k, renormalised if asked."""
    probs = logits.float().softmax(dim=-1)
    ids = top_k_stable(probs, k)
    weights = probs.gather(1, ids)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return ids, weights


def sigmoid_routing(logits: torch.Tensor, k: int, normalize: bool, bias: torch.Tensor,
                    num_groups: int = 1, top_groups: int = 1, scale: float = 1.0):
    """DeepSeek-V3 routing: choose on σ(s) + bias within the best groups, weigh by σ(s)."""
    scores = logits.float().sigmoid()
    choice = scores + bias
    if num_groups > 1:
        grouped = choice.view(len(choice), num_groups, -1)
        group_scores = grouped.topk(min(2, grouped.shape[-1]), dim=-1).values.sum(-1)
        kept = torch.zeros_like(group_scores, dtype=torch.bool)
        kept.scatter_(1, top_k_stable(group_scores, top_groups), True)
        choice = choice.masked_fill(~kept.repeat_interleave(grouped.shape[-1], 1), -torch.inf)
    ids = top_k_stable(choice, k)
    weights = scores.gather(1, ids)
    if normalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return ids, weights * scale


class TopKRouter(nn.Module):
    """Router logits W_r x -> (expert ids [T, k], weights [T, k]) by softmax or sigmoid."""

    def __init__(self, hidden_size: int, num_experts: int, top_k: int, norm_topk_prob: bool,
                 scoring: str = "softmax", routed_scaling_factor: float = 1.0,
                 num_groups: int = 1, top_groups: int = 1):
        super().__init__()
        if scoring not in SCORINGS:
            raise ValueError(f"router scoring must be one of {SCORINGS}, got {scoring!r}")
        if not 1 <= top_k <= num_experts or num_experts % num_groups:
            raise ValueError(f"need 1 <= top_k ({top_k}) <= num_experts ({num_experts}) "
                             f"and num_experts divisible by num_groups ({num_groups})")
        self.weight = nn.Parameter(torch.zeros(num_experts, hidden_size))
        self.top_k, self.norm_topk_prob, self.scoring = top_k, norm_topk_prob, scoring
        self.scale, self.num_groups, self.top_groups = routed_scaling_factor, num_groups, top_groups
        if scoring == "sigmoid":  # DeepSeek-V3's load-balancing bias, a checkpoint buffer
            self.register_buffer("e_score_correction_bias", torch.zeros(num_experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.scoring == "softmax":
            ids, weights = softmax_routing(F.linear(x, self.weight), self.top_k,
                                           self.norm_topk_prob)
            return ids, weights * self.scale
        logits = F.linear(x.float(), self.weight.float())
        return sigmoid_routing(logits, self.top_k, self.norm_topk_prob,
                               self.e_score_correction_bias, self.num_groups,
                               self.top_groups, self.scale)


def swiglu(rows: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """One expert on its rows: down(silu(gate x) ⊙ up x), gate and up fused as [2I, H]."""
    gate, up = F.linear(rows, gate_up).chunk(2, dim=-1)
    return F.linear(F.silu(gate) * up, down)


def sort_by_expert(expert_ids: torch.Tensor, num_experts: int):
    """The (token, slot) assignments [T*k] ordered by expert (stable: by token within an
    expert), and how many each expert got [E] (a Python list)."""
    flat = expert_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    return order, torch.bincount(flat, minlength=num_experts).tolist()


def run_experts(rows: torch.Tensor, counts: list[int], gate_up: torch.Tensor,
                down: torch.Tensor) -> torch.Tensor:
    """Rows grouped by expert (``counts[e]`` rows for expert e, in order) through their
    experts: one matmul per projection per expert that has rows; an expert with none is
    never read."""
    outputs = [swiglu(group, gate_up[e], down[e])
               for e, group in enumerate(rows.split(counts)) if len(group)]
    return torch.cat(outputs) if outputs else rows.new_zeros(0, down.shape[1])


def combine(rows: torch.Tensor, order: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Expert outputs [T*k, H] in expert order (row j answers assignment ``order[j]``) ->
    Σ_j weights[t, j] · output of (t, j), per token [T, H]: the rows are put back in
    (token, slot) order and each token's k weighted rows summed. (A gather and a sum:
    ``index_add_`` does the same but costs milliseconds per call on busy CPU threads.)"""
    tokens, k = weights.shape
    rows = rows * weights.reshape(-1)[order, None].to(rows.dtype)
    return rows[torch.argsort(order)].view(tokens, k, -1).sum(1)


def dispatch(x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor,
             gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """Σ_j weights[t, j] · expert_{ids[t, j]}(x_t) for every token t of x [T, H]."""
    order, counts = sort_by_expert(expert_ids, len(gate_up))
    token_of = order // expert_ids.shape[1]
    return combine(run_experts(x[token_of], counts, gate_up, down), order, weights).to(x.dtype)


class Experts(nn.Module):
    """E SwiGLU experts stacked: gate_up_proj [E, 2I, H] (gate rows first), down_proj
    [E, H, I] — transformers' own in-memory layout."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.zeros(num_experts, 2 * intermediate_size,
                                                     hidden_size))
        self.down_proj = nn.Parameter(torch.zeros(num_experts, hidden_size, intermediate_size))

    def forward(self, x, expert_ids, weights):
        return dispatch(x, expert_ids, weights, self.gate_up_proj, self.down_proj)


class SharedMLP(nn.Module):
    """The shared experts as one dense SwiGLU MLP (DeepSeek's ``shared_experts``); with
    ``gated``, its output is scaled by σ(w_g x) (Qwen2-MoE's ``shared_expert_gate``)."""

    def __init__(self, hidden_size: int, intermediate_size: int, gated: bool = False):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)
        self.output_gate = nn.Linear(hidden_size, 1, bias=False) if gated else None

    def forward(self, x):
        out = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        if self.output_gate is not None:
            out = out * torch.sigmoid(self.output_gate(x))
        return out


class MoE(nn.Module):
    """The MoE feed-forward layer, a drop-in for the dense MLP: [..., H] -> [..., H]."""

    def __init__(self, hidden_size: int, expert_intermediate_size: int, num_experts: int,
                 top_k: int, norm_topk_prob: bool, shared_intermediate_size: int | None = None,
                 scoring: str = "softmax", routed_scaling_factor: float = 1.0,
                 num_groups: int = 1, top_groups: int = 1, shared_gate: bool = False):
        super().__init__()
        self.gate = TopKRouter(hidden_size, num_experts, top_k, norm_topk_prob, scoring,
                               routed_scaling_factor, num_groups, top_groups)
        self.experts = Experts(num_experts, hidden_size, expert_intermediate_size)
        self.shared_experts = (SharedMLP(hidden_size, shared_intermediate_size, shared_gate)
                               if shared_intermediate_size else None)

    @classmethod
    def from_hf_config(cls, config: dict) -> MoE:
        """The layer a Hugging Face ``config.json`` (Qwen2-MoE, Qwen3-MoE, OLMoE, Mixtral,
        DeepSeek-V3) describes; its weights come from
        :func:`minillm.moe_checkpoint.state_from_hf`."""
        return cls(**moe_arguments(config))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        out = self.experts(flat, *self.gate(flat))
        if self.shared_experts is not None:
            out = out + self.shared_experts(flat)
        return out.reshape(x.shape)


@dataclass(frozen=True)
class ExpertTraffic:
    """Weight bytes one step's feed-forward reads: the MoE (router, the distinct experts
    its tokens chose, the shared experts) against a dense SwiGLU MLP as big as the
    active experts (k·I + shared) and one as big as all of them (E·I + shared)."""

    experts_used: int
    moe_bytes: int
    dense_active_bytes: int
    dense_total_bytes: int


def expert_bytes_read(expert_ids: torch.Tensor, num_experts: int, hidden_size: int,
                      expert_intermediate_size: int, shared_intermediate_size: int = 0,
                      bytes_per_weight: float = 4) -> ExpertTraffic:
    """:class:`ExpertTraffic` for one step whose routing chose ``expert_ids`` [T, k]."""
    mlp = 3 * hidden_size * bytes_per_weight  # bytes per unit of SwiGLU intermediate width
    used = int(torch.unique(expert_ids).numel())
    k = expert_ids.shape[-1]
    shared = shared_intermediate_size * mlp
    router = num_experts * hidden_size * bytes_per_weight
    return ExpertTraffic(used, int(router + used * expert_intermediate_size * mlp + shared),
                         int(k * expert_intermediate_size * mlp + shared),
                         int(num_experts * expert_intermediate_size * mlp + shared))
