"""Plausible wrong answers to chapter 14 (parallelism); the graded tests must catch each one.
Each mutant replaces the solution function named before its ``__``."""

from collections import deque

import torch
import torch.nn.functional as F

from minillm.parallel.pipeline import Event


def _part(weight, dim, world):
    size = weight.shape[dim]
    if size % world:
        raise ValueError(f"{size} does not split into {world} equal shards")
    return size // world


# -- 14.1 shard_weight / unshard ------------------------------------------------------------

def shard_weight__view(weight, dim, rank, world):
    """Returns narrow()'s view: the rank keeps the whole weight's storage alive."""
    part = _part(weight, dim, world)
    return weight.narrow(dim, rank * part, part)


def shard_weight__contiguous_is_not_a_copy(weight, dim, rank, world):
    """Calls .contiguous() to get its own tensor: a row slice is already contiguous, so it
    stays a view of the weight."""
    part = _part(weight, dim, world)
    return weight.narrow(dim, rank * part, part).contiguous()


def shard_weight__clone_then_slice(weight, dim, rank, world):
    """Clones the whole weight, then slices the clone: the rank holds a full copy."""
    part = _part(weight, dim, world)
    return weight.clone().narrow(dim, rank * part, part)


def shard_weight__interleaved(weight, dim, rank, world):
    """Takes every world-th row or column (weight[rank::world]) instead of a contiguous run."""
    _part(weight, dim, world)
    index = torch.arange(rank, weight.shape[dim], world)
    return weight.index_select(dim, index)


def shard_weight__chunk(weight, dim, rank, world):
    """torch.chunk: on a size that does not divide, it silently makes uneven shards."""
    return torch.chunk(weight, world, dim)[rank].clone()


def shard_weight__inclusive_end(weight, dim, rank, world):
    """Slices [r·part, (r + 1)·part] with the end included: one row too many (but the last)."""
    part = _part(weight, dim, world)
    start = rank * part
    return weight.narrow(dim, start, min(part + 1, weight.shape[dim] - start)).clone()


def shard_weight__always_rows(weight, dim, rank, world):
    """Ignores dim: always cuts the output rows (dim 0), so row-parallel shards are wrong."""
    part = _part(weight, 0, world)
    return weight[rank * part:(rank + 1) * part].clone()


def shard_weight__float32_buffer(weight, dim, rank, world):
    """Copies the slice into a freshly allocated torch.empty(shape): float32, whatever the
    weight's dtype."""
    part = _part(weight, dim, world)
    piece = weight.narrow(dim, rank * part, part)
    out = torch.empty(piece.shape)
    out.copy_(piece)
    return out


def unshard__stack(shards, dim):
    """torch.stack: a new dimension of ranks instead of joining along dim."""
    return torch.stack(list(shards), dim=dim)


def unshard__along_rows(shards, dim):
    """Always concatenates along dim 0, whatever dim the shards were cut along."""
    return torch.cat(list(shards), dim=0)


def unshard__sum(shards, dim):
    """Adds the shards (an all-reduce) instead of putting them side by side (an all-gather)."""
    return torch.stack(list(shards)).sum(0)


# -- 14.2 parallel_mlp / all_reduce ---------------------------------------------------------

def _slices(size, world):
    part = size // world
    return [slice(r * part, (r + 1) * part) for r in range(world)]


def parallel_mlp__reduce_after_gate_up(x, gate, up, down, world):
    """All-reduces after gate and up, then every rank applies the whole of down: each rank
    returns the full output, so the sum counts it world times."""
    g = sum(x @ gate[cols].T @ torch.eye(gate.shape[0], dtype=x.dtype)[cols]
            for cols in _slices(gate.shape[0], world))  # the all-reduced gate projection
    u = sum(x @ up[cols].T @ torch.eye(up.shape[0], dtype=x.dtype)[cols]
            for cols in _slices(up.shape[0], world))
    out = (F.silu(g) * u) @ down.T
    return [out.clone() for _ in range(world)]


def parallel_mlp__down_by_output_rows(x, gate, up, down, world):
    """Cuts down by output rows (dim 0) like gate and up: each rank gets a slice of the
    output's columns from the whole activation, not a partial sum of all of them."""
    h = F.silu(x @ gate.T) * (x @ up.T)
    return [h @ down[rows].T for rows in _slices(down.shape[0], world)]


def parallel_mlp__silu_after_sum(x, gate, up, down, world):
    """Leaves silu out of the ranks (to apply after the all-reduce): down(gate x * up x)."""
    return [((x @ gate[cols].T) * (x @ up[cols].T)) @ down[:, cols].T
            for cols in _slices(gate.shape[0], world)]


def parallel_mlp__strided_gate(x, gate, up, down, world):
    """Takes gate's rows interleaved (gate[r::world]) but up's and down's contiguous: rank
    r multiplies silu of one set of neurons by the up projection of another."""
    out = []
    for rank, cols in enumerate(_slices(gate.shape[0], world)):
        h = F.silu(x @ gate[rank::world].T) * (x @ up[cols].T)
        out.append(h @ down[:, cols].T)
    return out


def parallel_mlp__each_rank_divides_by_world(x, gate, up, down, world):
    """Scales each rank's partial by 1/world, as if the all-reduce were an average."""
    return [((F.silu(x @ gate[cols].T) * (x @ up[cols].T)) @ down[:, cols].T) / world
            for cols in _slices(gate.shape[0], world)]


def all_reduce__mean(partials):
    """Averages the partials instead of summing them."""
    return torch.stack(list(partials)).mean(0)


def all_reduce__gather(partials):
    """Concatenates the partials along the last dimension: an all-gather, not an all-reduce."""
    return torch.cat(list(partials), dim=-1)


def all_reduce__in_place(partials):
    """Adds into the first partial in place (as dist.all_reduce does): rank 0's tensor
    changes under the caller."""
    total = partials[0]
    for partial in partials[1:]:
        total += partial
    return total


def all_reduce__first_rank(partials):
    """Returns rank 0's partial, as if every rank already had the whole answer."""
    return partials[0].clone()


# -- 14.3 gpipe_bubble / pipeline_time ------------------------------------------------------

def _check(stages, microbatches):
    if stages < 1 or microbatches < 1:
        raise ValueError("a pipeline needs a stage and a micro-batch")


def gpipe_bubble__over_microbatches(stages, microbatches):
    """(p − 1)/m: the idle time relative to the work, not to the whole run."""
    _check(stages, microbatches)
    return (stages - 1) / microbatches


def gpipe_bubble__off_by_one(stages, microbatches):
    """(p − 1)/(m + p): counts one stage time too many in the makespan."""
    _check(stages, microbatches)
    return (stages - 1) / (microbatches + stages)


def gpipe_bubble__busy_share(stages, microbatches):
    """m/(m + p − 1): the share of time a stage works, not the share it waits."""
    _check(stages, microbatches)
    return microbatches / (microbatches + stages - 1)


def gpipe_bubble__no_check(stages, microbatches):
    """The formula without refusing an empty pipeline (0 stages gives a negative bubble)."""
    return (stages - 1) / (microbatches + stages - 1)


def pipeline_time__no_overlap(stage_time, stages, microbatches):
    """m·p·t: each micro-batch runs through every stage before the next one starts."""
    _check(stages, microbatches)
    return microbatches * stages * stage_time


def pipeline_time__off_by_one(stage_time, stages, microbatches):
    """(m + p)·t: one stage time too many for filling the pipeline."""
    _check(stages, microbatches)
    return (microbatches + stages) * stage_time


def pipeline_time__ignores_fill(stage_time, stages, microbatches):
    """m·t: the busy time of one stage, without the fill and drain."""
    _check(stages, microbatches)
    return microbatches * stage_time


def pipeline_time__no_check(stage_time, stages, microbatches):
    """The formula without refusing an empty pipeline."""
    return (microbatches + stages - 1) * stage_time


# -- 14.4 all_reduce_bytes / tp_bytes_per_token ---------------------------------------------

def _check_world(world):
    if world < 1:
        raise ValueError("the world size must be at least 1")


def all_reduce_bytes__all_gather(message_bytes, world):
    """(t − 1)/t · n: an all-gather's bytes, half of a ring all-reduce."""
    _check_world(world)
    return (world - 1) / world * message_bytes


def all_reduce_bytes__chunks_are_whole_messages(message_bytes, world):
    """2(t − 1) · n: each of the 2(t − 1) steps sends the whole message, not a 1/t chunk."""
    _check_world(world)
    return 2 * (world - 1) * message_bytes


def all_reduce_bytes__to_every_rank(message_bytes, world):
    """(t − 1) · n: sends the whole message to each other rank (the naive all-to-all)."""
    _check_world(world)
    return (world - 1) * message_bytes


def all_reduce_bytes__always_twice(message_bytes, world):
    """2n whatever t: the ring's limit, even for a single rank that sends nothing."""
    _check_world(world)
    return 2.0 * message_bytes


def tp_bytes_per_token__one_all_reduce_per_layer(hidden, layers, world, bytes_per_value=2):
    """Counts one all-reduce per block (the MLP's) and forgets attention's."""
    _check_world(world)
    return layers * 2 * (world - 1) / world * hidden * bytes_per_value


def tp_bytes_per_token__values_not_bytes(hidden, layers, world, bytes_per_value=2):
    """Counts values sent, not bytes: leaves out bytes_per_value."""
    _check_world(world)
    return layers * 2 * 2 * (world - 1) / world * hidden


def tp_bytes_per_token__one_block(hidden, layers, world, bytes_per_value=2):
    """The bytes of one block only: leaves out the number of layers."""
    _check_world(world)
    return 2 * 2 * (world - 1) / world * hidden * bytes_per_value


def tp_bytes_per_token__no_ring_factor(hidden, layers, world, bytes_per_value=2):
    """Prices each all-reduce at 2n bytes, whatever t: even one rank would send."""
    _check_world(world)
    return layers * 2 * 2 * hidden * bytes_per_value


# -- 14.5 ring_all_reduce --------------------------------------------------------------------

def _ring(tensors, reduce_shift, gather_shift, gather_adds=False, gather=True, copy=True):
    world = len(tensors)
    flat = [t.flatten().clone() if copy else t.view(-1) for t in tensors]
    chunks = [list(f.tensor_split(world)) for f in flat]
    messages = []
    phases = [("reduce", reduce_shift)] + ([("gather", gather_shift)] if gather else [])
    for phase, shift_of in phases:
        for step in range(world - 1):
            sent = [(r, (r + shift_of(step)) % world) for r in range(world)]
            data = [chunks[r][c].clone() for r, c in sent]
            for (r, c), values in zip(sent, data, strict=True):
                receiver = (r + 1) % world
                if phase == "reduce" or gather_adds:
                    chunks[receiver][c] += values
                else:
                    chunks[receiver][c] = values
                messages.append((r, receiver, c))
    return [torch.cat(c).view_as(t) for c, t in zip(chunks, tensors, strict=True)], messages


def ring_all_reduce__reduce_scatter_only(tensors):
    """Stops after the reduce-scatter: each rank holds one summed chunk, the rest partial."""
    return _ring(tensors, lambda s: -s, None, gather=False)


def ring_all_reduce__gather_adds(tensors):
    """Adds in the all-gather too, so the summed chunks are counted again."""
    return _ring(tensors, lambda s: -s, lambda s: 1 - s, gather_adds=True)


def ring_all_reduce__gather_wrong_chunk(tensors):
    """Starts the all-gather from chunk r instead of the chunk r completed, (r + 1) % t."""
    return _ring(tensors, lambda s: -s, lambda s: -s)


def ring_all_reduce__in_place(tensors):
    """Cuts the inputs themselves into chunks (views): the callers' tensors are overwritten."""
    return _ring(tensors, lambda s: -s, lambda s: 1 - s, copy=False)


def ring_all_reduce__everyone_to_everyone(tensors):
    """Sends every tensor to every other rank whole: the right sum, not a ring."""
    world = len(tensors)
    total = torch.stack(list(tensors)).sum(0)
    messages = [(r, receiver, 0) for r in range(world) for receiver in range(world)
                if receiver != r]
    return [total.clone() for _ in range(world)], messages


# -- 14.6 stage_order / simulate_pipeline ----------------------------------------------------

def _order(kind, microbatches, backward, warmup):
    if kind not in ("gpipe", "1f1b"):
        raise ValueError(f"unknown pipeline schedule {kind!r}")
    forwards = [("F", i) for i in range(microbatches)]
    backwards = [("B", i) for i in range(microbatches)]
    if not backward:
        return forwards
    if kind == "gpipe":
        return forwards + backwards
    order = forwards[:warmup]
    for i in range(microbatches - warmup):
        order += [forwards[warmup + i], backwards[i]]
    return order + backwards[microbatches - warmup:]


def stage_order__warmup_p_minus_s(kind, stage, stages, microbatches, backward=True):
    """Warms up with p − s forwards instead of p − s − 1: the last stage does one forward
    before it starts alternating."""
    return _order(kind, microbatches, backward, min(stages - stage, microbatches))


def stage_order__warmup_from_the_first_stage(kind, stage, stages, microbatches,
                                             backward=True):
    """Gives stage s s warm-up forwards: the first stage alternates at once, the last
    warms up longest (the pipeline counted from the wrong end)."""
    return _order(kind, microbatches, backward, min(stage, microbatches))


def stage_order__warmup_not_capped(kind, stage, stages, microbatches, backward=True):
    """Does not cap the warm-up at m: with fewer micro-batches than p − s − 1, the
    remaining backwards are sliced from a negative index and some go missing."""
    return _order(kind, microbatches, backward, stages - stage - 1)


def _simulate(orders, forward_times, backward_times, input_of, own_stage_waits=True,
              by_stage=False):
    duration = {"F": forward_times, "B": backward_times}
    waiting = [deque(order) for order in orders]
    ended = {}
    stage_free = [0.0] * len(orders)
    events = []
    while any(waiting):
        ran = len(events)
        for stage, queue in enumerate(waiting):
            while queue:
                phase, microbatch = queue[0]
                needed = input_of(stage, phase, microbatch, len(orders) - 1)
                if needed is not None and needed not in ended:
                    break
                queue.popleft()
                start = ended.get(needed, 0.0)
                if own_stage_waits:
                    start = max(start, stage_free[stage])
                end = start + duration[phase][stage]
                ended[stage, phase, microbatch] = stage_free[stage] = end
                events.append(Event(stage, microbatch, phase, start, end))
        if len(events) == ran:
            raise ValueError("the pipeline is stuck")
    key = (lambda e: (e.stage, e.start)) if by_stage else (lambda e: (e.start, e.stage))
    return sorted(events, key=key)


def _input_of(stage, phase, microbatch, last):
    if phase == "F":
        return (stage - 1, "F", microbatch) if stage > 0 else None
    return (stage + 1, "B", microbatch) if stage < last else (stage, "F", microbatch)


def simulate_pipeline__backward_from_the_previous_stage(orders, forward_times,
                                                        backward_times):
    """Makes a backward wait for the previous stage's backward, as a forward does, when
    the gradient flows the other way: from the last stage to the first."""
    def input_of(stage, phase, microbatch, last):
        if stage == 0:
            return None if phase == "F" else (0, "F", microbatch)
        return (stage - 1, phase, microbatch)
    return _simulate(orders, forward_times, backward_times, input_of)


def simulate_pipeline__stage_never_busy(orders, forward_times, backward_times):
    """Starts each operation when its input has ended, without waiting for the stage to
    finish its previous one: a stage runs several operations at once."""
    return _simulate(orders, forward_times, backward_times, _input_of, own_stage_waits=False)


def simulate_pipeline__last_backward_waits_for_nothing(orders, forward_times,
                                                       backward_times):
    """Lets the last stage's backward start without its own forward (the loss): an order
    with B0 before F0 on the last stage runs instead of being refused."""
    def input_of(stage, phase, microbatch, last):
        if phase == "B" and stage == last:
            return None
        return _input_of(stage, phase, microbatch, last)
    return _simulate(orders, forward_times, backward_times, input_of)


def simulate_pipeline__sorted_by_stage(orders, forward_times, backward_times):
    """Returns the events stage by stage (each stage's in time order), not sorted by start
    time across the stages."""
    return _simulate(orders, forward_times, backward_times, _input_of, by_stage=True)


def simulate_pipeline__first_stage_times(orders, forward_times, backward_times):
    """Uses stage 0's forward and backward times for every stage: a slow stage is not
    slow."""
    stages = len(orders)
    return _simulate(orders, [forward_times[0]] * stages, [backward_times[0]] * stages,
                     _input_of)
