"""Expert parallelism: each rank holds E/W of an MoE layer's experts, and tokens travel.

GShard (Lepikhin et al. 2020, §2.2) and Switch place different experts on different
devices; a token goes to the devices of the experts its router chose and comes back.
With ``world`` ranks, rank r holds experts r·E/W .. (r+1)·E/W − 1; the router and the
shared experts are replicated. For the tokens x [T, H] a rank holds (its own batch):

1. route them locally: expert ids and weights [T, k];
2. sort the T·k assignments by expert, so the rows bound for each rank are contiguous;
3. ``all_to_all`` the per-expert counts: each rank learns how many rows it will receive
   from each other rank, for each of its experts;
4. ``all_to_all`` the rows; each rank runs its experts on what it received (regrouped by
   expert: one matmul per projection per active expert, :func:`minillm.moe.run_experts`);
5. ``all_to_all`` the results back along the reverse splits, then weight them and add
   them to their tokens (plus the shared experts, computed at home).

Three ``all_to_all`` per layer call (gloo implements ``all_to_all_single`` with uneven
splits on CPU tensors); each is counted in :data:`.layers.COLLECTIVES`. The result equals
one process running the whole layer on the same tokens.

Inside a tensor-parallel model every rank already holds every token (the activations are
replicated between layers), so nothing needs to travel: with ``tokens="replicated"`` each
rank runs its own experts on the rows routed to them and one all-reduce adds the ranks'
parts, as a row-parallel linear does.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import nn

from ..moe import MoE, combine, run_experts, sort_by_expert
from .layers import COLLECTIVES, all_reduce


def all_to_all_rows(rows: torch.Tensor, send: list[int], receive: list[int]) -> torch.Tensor:
    """Send ``rows[sum(send[:r]):sum(send[:r+1])]`` to rank r; receive ``receive[r]`` rows
    from rank r, in rank order (counted)."""
    COLLECTIVES["all_to_all"] += 1
    out = rows.new_empty((sum(receive), *rows.shape[1:]))
    dist.all_to_all_single(out, rows.contiguous(), receive, send)
    return out


class ExpertParallelMoE(nn.Module):
    """This rank's part of an :class:`~minillm.moe.MoE`: the router and shared experts,
    and experts ``first_expert .. first_expert + local_experts - 1``. ``tokens``: "own"
    (each rank its own batch: the all_to_all exchange) or "replicated" (every rank holds
    the same tokens, as in a tensor-parallel model: each computes its experts' part and
    one all-reduce sums them)."""

    def __init__(self, layer: MoE, rank: int, world: int, tokens: str = "own"):
        super().__init__()
        if tokens not in ("own", "replicated"):
            raise ValueError(f"tokens must be 'own' or 'replicated', got {tokens!r}")
        self.replicated = tokens == "replicated"
        self.num_experts = len(layer.experts.gate_up_proj)
        if self.num_experts % world:
            raise ValueError(f"{self.num_experts} experts do not split evenly over {world} "
                             "ranks; choose a world size that divides the expert count")
        self.local_experts, self.world = self.num_experts // world, world
        self.first_expert = rank * self.local_experts
        own = slice(self.first_expert, self.first_expert + self.local_experts)
        self.gate = copy.deepcopy(layer.gate)
        self.shared_experts = copy.deepcopy(layer.shared_experts)
        self.gate_up_proj = nn.Parameter(layer.experts.gate_up_proj.detach()[own].clone())
        self.down_proj = nn.Parameter(layer.experts.down_proj.detach()[own].clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        expert_ids, weights = self.gate(flat)
        order, counts = sort_by_expert(expert_ids, self.num_experts)
        token_of = order // expert_ids.shape[1]
        rows = (self.local_part if self.replicated else self.exchange)(flat[token_of], counts)
        out = combine(rows, order, weights).to(flat.dtype)
        if self.replicated:
            all_reduce(out)
        if self.shared_experts is not None:
            out = out + self.shared_experts(flat)
        return out.reshape(x.shape)

    def local_part(self, rows: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """Rows sorted by expert (``counts`` per expert, all E) -> the rows of this rank's
        experts through them, every other row zero."""
        start = sum(counts[:self.first_expert])
        mine = counts[self.first_expert:self.first_expert + self.local_experts]
        out = rows.new_zeros(len(rows), self.down_proj.shape[1])
        out[start:start + sum(mine)] = run_experts(rows[start:start + sum(mine)], mine,
                                                   self.gate_up_proj, self.down_proj)
        return out

    def exchange(self, rows: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """Rows sorted by expert (``counts`` per expert, all E) -> each row through its
        expert, wherever that expert lives; same order."""
        per_rank = torch.tensor(counts).view(self.world, self.local_experts)
        received = all_to_all_rows(per_rank, [1] * self.world, [1] * self.world)
        send, receive = per_rank.sum(1).tolist(), received.sum(1).tolist()
        arrived = all_to_all_rows(rows, send, receive)
        # from each source, rows come sorted by local expert; regroup them over sources
        local_ids = torch.repeat_interleave(torch.arange(self.local_experts).repeat(self.world),
                                            received.reshape(-1))
        order = torch.argsort(local_ids, stable=True)
        done = run_experts(arrived[order], received.sum(0).tolist(), self.gate_up_proj,
                           self.down_proj)
        results = torch.empty_like(done).index_copy_(0, order, done)
        return all_to_all_rows(results, receive, send)


def expert_parallel(layer: MoE, rank: int, world: int, tokens: str = "own") -> ExpertParallelMoE:
    """Rank ``rank``'s expert-parallel copy of ``layer`` (``layer`` itself is unchanged);
    call it inside a process group of ``world`` ranks."""
    return ExpertParallelMoE(layer, rank, world, tokens)
