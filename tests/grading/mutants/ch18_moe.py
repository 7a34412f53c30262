"""Plausible wrong answers to chapter 18 (the top-k router, the grouped expert dispatch,
DeepSeek-V3's router);
the graded tests must catch each one. Each mutant replaces the solution function named
before its ``__``."""

import torch
import torch.nn.functional as F


def route_top_k__no_renormalise(logits, k, normalize):
    """Ignores ``normalize``: the kept probabilities never sum to 1."""
    probs = logits.float().softmax(dim=-1)
    ids = torch.sort(probs, dim=-1, descending=True, stable=True).indices[:, :k]
    return ids, probs.gather(1, ids)


def route_top_k__softmax_after_top_k(logits, k, normalize):
    """Softmax over the k kept logits (Mixtral's form): right only when renormalising."""
    ids = torch.sort(logits.float(), dim=-1, descending=True, stable=True).indices[:, :k]
    return ids, logits.float().gather(1, ids).softmax(dim=-1)


def route_top_k__top_k_over_tokens(logits, k, normalize):
    """Takes the top k along the token axis (each expert's best tokens), then transposes."""
    probs = logits.float().softmax(dim=-1)
    ids = torch.sort(probs, dim=0, descending=True, stable=True).indices[:k].T
    weights = probs.gather(1, ids.clamp(max=probs.shape[1] - 1))
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return ids, weights


def route_top_k__ties_to_higher_id(logits, k, normalize):
    """Breaks ties towards the higher expert id."""
    probs = logits.float().softmax(dim=-1)
    flipped = torch.sort(probs.flip(-1), dim=-1, descending=True, stable=True).indices[:, :k]
    ids = probs.shape[-1] - 1 - flipped
    weights = probs.gather(1, ids)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return ids, weights


def route_top_k__weights_in_logits_dtype(logits, k, normalize):
    """Computes the softmax in the logits' dtype (bfloat16 rounds the weights)."""
    probs = logits.softmax(dim=-1)
    ids = torch.sort(probs, dim=-1, descending=True, stable=True).indices[:, :k]
    weights = probs.gather(1, ids)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return ids, weights


def _expert(rows, gate_up, down):
    gate, up = F.linear(rows, gate_up).chunk(2, dim=-1)
    return F.linear(F.silu(gate) * up, down)


def grouped_expert_forward__weights_not_applied(x, expert_ids, weights, gate_up, down):
    """Adds the experts' outputs without their routing weights."""
    order = torch.argsort(expert_ids.reshape(-1), stable=True)
    counts = torch.bincount(expert_ids.reshape(-1), minlength=len(gate_up)).tolist()
    token_of = order // expert_ids.shape[1]
    rows = torch.cat([_expert(r, gate_up[e], down[e])
                      for e, r in enumerate(x[token_of].split(counts)) if len(r)])
    return torch.zeros_like(x).index_add_(0, token_of, rows)


def grouped_expert_forward__scatter_to_wrong_token(x, expert_ids, weights, gate_up, down):
    """Maps an assignment back to token ``position % tokens`` instead of ``position // k``."""
    order = torch.argsort(expert_ids.reshape(-1), stable=True)
    counts = torch.bincount(expert_ids.reshape(-1), minlength=len(gate_up)).tolist()
    token_of = order % len(x)
    rows = torch.cat([_expert(r, gate_up[e], down[e])
                      for e, r in enumerate(x[token_of].split(counts)) if len(r)])
    rows = rows * weights.reshape(-1)[order, None].to(x.dtype)
    return torch.zeros_like(x).index_add_(0, token_of, rows)


def grouped_expert_forward__drops_overflow_tokens(x, expert_ids, weights, gate_up, down):
    """Gives each expert a fixed capacity (Switch's, factor 1.25) and drops the tokens past it."""
    capacity = max(1, int(1.25 * expert_ids.numel() / len(gate_up) + 0.999))
    out = torch.zeros_like(x)
    for e in range(len(gate_up)):
        tokens, slots = torch.where(expert_ids == e)
        tokens, slots = tokens[:capacity], slots[:capacity]
        if len(tokens):
            rows = _expert(x[tokens], gate_up[e], down[e])
            out.index_add_(0, tokens, rows * weights[tokens, slots, None].to(x.dtype))
    return out


def grouped_expert_forward__every_expert_on_every_token(x, expert_ids, weights, gate_up, down):
    """Runs all experts densely and zero-weights the ones not chosen: reads idle experts."""
    dense = torch.zeros(len(x), len(gate_up), dtype=x.dtype)
    dense.scatter_(1, expert_ids, weights.to(x.dtype))
    outputs = torch.stack([_expert(x, gate_up[e], down[e]) for e in range(len(gate_up))], 1)
    return (dense[..., None] * outputs).sum(1)


def grouped_expert_forward__loop_over_tokens(x, expert_ids, weights, gate_up, down):
    """Right answer, one token and expert at a time: work grows with the tokens."""
    out = torch.zeros_like(x)
    for t in range(len(x)):
        for j in range(expert_ids.shape[1]):
            e = int(expert_ids[t, j])
            out[t] += weights[t, j].to(x.dtype) * _expert(x[t:t + 1], gate_up[e], down[e])[0]
    return out


def grouped_expert_forward__up_then_gate(x, expert_ids, weights, gate_up, down):
    """Reads gate_up as up rows first, then gate rows."""
    order = torch.argsort(expert_ids.reshape(-1), stable=True)
    counts = torch.bincount(expert_ids.reshape(-1), minlength=len(gate_up)).tolist()
    token_of = order // expert_ids.shape[1]
    rows = torch.cat([_expert(r, gate_up[e].roll(gate_up.shape[1] // 2, 0), down[e])
                      for e, r in enumerate(x[token_of].split(counts)) if len(r)])
    rows = rows * weights.reshape(-1)[order, None].to(x.dtype)
    return torch.zeros_like(x).index_add_(0, token_of, rows)


def _grouped_choice(choice, num_groups, top_groups, group_score):
    grouped = choice.view(len(choice), num_groups, -1)
    best = torch.sort(group_score(grouped), dim=-1, descending=True, stable=True).indices
    kept = torch.zeros(len(choice), num_groups, dtype=torch.bool)
    kept.scatter_(1, best[:, :top_groups], True)
    return choice.masked_fill(~kept.repeat_interleave(grouped.shape[-1], 1), -torch.inf)


def _top_two_sum(grouped):
    return grouped.topk(2, dim=-1).values.sum(-1)


def _pick(choice, k):
    return torch.sort(choice, dim=-1, descending=True, stable=True).indices[:, :k]


def route_sigmoid_grouped__weights_from_biased_scores(logits, k, bias, num_groups, top_groups,
                                                      scale):
    """Weighs the chosen experts by sigmoid + bias instead of the sigmoid alone."""
    choice = logits.float().sigmoid() + bias
    ids = _pick(_grouped_choice(choice, num_groups, top_groups, _top_two_sum), k)
    weights = choice.gather(1, ids)
    return ids, weights / (weights.sum(dim=-1, keepdim=True) + 1e-20) * scale


def route_sigmoid_grouped__no_group_limit(logits, k, bias, num_groups, top_groups, scale):
    """Chooses among all experts, ignoring the groups."""
    scores = logits.float().sigmoid()
    ids = _pick(scores + bias, k)
    weights = scores.gather(1, ids)
    return ids, weights / (weights.sum(dim=-1, keepdim=True) + 1e-20) * scale


def route_sigmoid_grouped__group_score_is_the_max(logits, k, bias, num_groups, top_groups,
                                                  scale):
    """Scores a group by its best expert (DeepSeek-V2's rule) instead of its best two."""
    scores = logits.float().sigmoid()
    choice = _grouped_choice(scores + bias, num_groups, top_groups,
                             lambda grouped: grouped.max(dim=-1).values)
    ids = _pick(choice, k)
    weights = scores.gather(1, ids)
    return ids, weights / (weights.sum(dim=-1, keepdim=True) + 1e-20) * scale


def route_sigmoid_grouped__scale_before_normalising(logits, k, bias, num_groups, top_groups,
                                                    scale):
    """Multiplies by the scaling factor before renormalising, which cancels it."""
    scores = logits.float().sigmoid()
    ids = _pick(_grouped_choice(scores + bias, num_groups, top_groups, _top_two_sum), k)
    weights = scores.gather(1, ids) * scale
    return ids, weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)


def route_sigmoid_grouped__softmax_scores(logits, k, bias, num_groups, top_groups, scale):
    """Scores experts with a softmax (the V2 router) instead of a sigmoid."""
    scores = logits.float().softmax(dim=-1)
    ids = _pick(_grouped_choice(scores + bias, num_groups, top_groups, _top_two_sum), k)
    weights = scores.gather(1, ids)
    return ids, weights / (weights.sum(dim=-1, keepdim=True) + 1e-20) * scale
