"""Plausible wrong answers to chapter 14 (parallelism), communication
(14.4 all_reduce_bytes / tp_bytes_per_token, 14.5 ring_all_reduce); the graded tests must
catch each one.
Each mutant replaces the solution function named before its ``__``."""

import torch

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
