"""What tensor parallelism sends: the ring collectives' bytes and times, per token and per step.

Tensor parallelism (Megatron-LM, Shoeybi et al. 2019, §3) splits every layer's weights
over ``t`` GPUs. Attention and the MLP each end in a row-parallel linear whose output is a
partial sum on every rank, so each transformer block does **two all-reduces** of its
activations in the forward pass (Megatron's ``g`` operator, once per sub-block). For one
token the activation is a vector of ``h`` values, so one block sends

    2 all-reduces x 2(t - 1)/t x h x bytes per value      (per rank, per token)

A **ring all-reduce** (Patarasuk & Yuan 2009) is a reduce-scatter followed by an
all-gather: in each of ``t - 1`` steps of either half a rank sends one ``1/t`` chunk of
the message to its neighbour, so every rank sends ``2(t - 1)/t`` times the message,
whatever ``t``: the least any all-reduce can send. What does grow with ``t`` is the
number of steps, ``2(t - 1)``, and each step pays a fixed latency. The **alpha-beta
model** (Hockney 1994; used for MPI collectives by Thakur, Rabenseifner & Gropp 2005)
charges ``alpha`` seconds per step and ``1 / beta`` seconds per byte:

    t_all_reduce = 2(t - 1) alpha + 2(t - 1)/t x n / beta

Sequence parallelism (Korthikanti et al. 2022) replaces each all-reduce by a
reduce-scatter and an all-gather around the norms: the same bytes
(:func:`sequence_parallel_layer_bytes_per_token`), less activation memory.
"""

from __future__ import annotations

import numbers

from .catalogue import Interconnect, ModelShape


def check_world(world: int) -> None:
    """Refuse a world size (number of ranks) that is not a positive integer."""
    if isinstance(world, bool) or not isinstance(world, numbers.Integral) or world < 1:
        raise ValueError(f"the world size (number of ranks) must be an integer >= 1, "
                         f"got {world!r}")


def _check_bytes(message_bytes: float) -> None:
    if message_bytes < 0:
        raise ValueError(f"a message cannot have a negative size, got {message_bytes} bytes")


# --- The collectives: bytes each rank sends -------------------------------------------------

def ring_all_reduce_bytes(message_bytes: float, world: int) -> float:
    """Bytes each rank sends in a ring all-reduce of a ``message_bytes`` message:
    ``2(t - 1)/t x n`` (reduce-scatter then all-gather, ``t - 1`` chunks of ``n/t`` each;
    Patarasuk & Yuan 2009). Zero for one rank."""
    check_world(world)
    _check_bytes(message_bytes)
    return 2 * (world - 1) * message_bytes / world


def ring_all_gather_bytes(message_bytes: float, world: int) -> float:
    """Bytes each rank sends in a ring all-gather whose *gathered* result is
    ``message_bytes``: ``(t - 1)/t x n`` (its own ``n/t`` chunk, then ``t - 2`` forwarded)."""
    check_world(world)
    _check_bytes(message_bytes)
    return (world - 1) * message_bytes / world


def ring_reduce_scatter_bytes(message_bytes: float, world: int) -> float:
    """Bytes each rank sends in a ring reduce-scatter of a ``message_bytes`` input (each
    rank ends with the sum of one ``n/t`` chunk): ``(t - 1)/t x n``, half an all-reduce."""
    check_world(world)
    _check_bytes(message_bytes)
    return (world - 1) * message_bytes / world


# --- Tensor parallelism's bytes per token ---------------------------------------------------

def tp_layer_bytes_per_token(shape: ModelShape, world: int) -> float:
    """Bytes each rank sends per token in one transformer block under tensor parallelism:
    two all-reduces (attention's and the MLP's, Megatron §3) of an ``h``-vector,
    ``2 x 2(t - 1)/t x h x bytes``. Llama-2-7B at t = 2: 2 x 1 x 4096 x 2 = 16,384."""
    return 2 * ring_all_reduce_bytes(shape.hidden_bytes, world)


def tp_bytes_per_token(shape: ModelShape, world: int) -> float:
    """Bytes each rank sends per token in all ``L`` blocks: ``L x`` the block's. The
    vocabulary's collectives are extra (:func:`vocab_bytes_per_token`)."""
    return shape.num_layers * tp_layer_bytes_per_token(shape, world)


def vocab_bytes_per_token(shape: ModelShape, world: int) -> float:
    """Bytes each rank sends per token for a vocabulary-parallel embedding and LM head (as
    :func:`minillm.parallel.tensor_parallel` does): an all-reduce of the embedded
    ``h``-vector (each rank looked up only its own tokens) and an all-gather of the
    ``V`` logits. Once per model, not per layer; Megatron avoids the logits gather in
    training by fusing the cross-entropy, but generation needs the logits (or a
    distributed argmax/sample)."""
    embedding = ring_all_reduce_bytes(shape.hidden_bytes, world)
    return embedding + ring_all_gather_bytes(shape.vocab_size * shape.bytes_per_value, world)


def tp_bytes_per_pass(shape: ModelShape, world: int, batch: int, seq_len: int) -> float:
    """Bytes each rank sends in the blocks for a forward pass over ``batch`` sequences of
    ``seq_len`` tokens: each all-reduce's message is ``b x s x h`` values, so the bytes are
    ``b x s x`` the per-token ones (the *number* of all-reduces, 2L, does not grow)."""
    return batch * seq_len * tp_bytes_per_token(shape, world)


def sequence_parallel_layer_bytes_per_token(shape: ModelShape, world: int) -> float:
    """Sequence parallelism (Korthikanti et al. 2022): each of the block's two
    all-reduces becomes a reduce-scatter (into the sequence-split norm) and an all-gather
    (back out of it). ``(t - 1)/t + (t - 1)/t = 2(t - 1)/t``: exactly the bytes of the
    all-reduce it replaces; what it saves is activation memory, not communication."""
    message = shape.hidden_bytes
    both = ring_reduce_scatter_bytes(message, world) + ring_all_gather_bytes(message, world)
    return 2 * both


# --- Time (alpha-beta model) ----------------------------------------------------------------

def all_reduce_time(message_bytes: float, world: int, link: Interconnect) -> float:
    """Seconds of a ring all-reduce (alpha-beta model): ``2(t - 1)`` steps of latency plus
    the bytes each rank sends over its bandwidth, ``2(t - 1) alpha + 2(t - 1)/t n / beta``."""
    check_world(world)
    steps = 2 * (world - 1)
    return steps * link.latency + ring_all_reduce_bytes(message_bytes, world) / link.bandwidth


def all_gather_time(message_bytes: float, world: int, link: Interconnect) -> float:
    """Seconds of a ring all-gather into ``message_bytes``: half an all-reduce's steps,
    ``(t - 1) alpha + (t - 1)/t n / beta``."""
    check_world(world)
    steps = world - 1
    return steps * link.latency + ring_all_gather_bytes(message_bytes, world) / link.bandwidth


def layers_communication_time(shape: ModelShape, world: int, link: Interconnect,
                              batch: int = 1) -> float:
    """Seconds of one decode step's 2L all-reduces (``batch`` tokens: messages of
    ``b x h`` values). Not overlapped with compute: each block waits for its sums."""
    message = batch * shape.hidden_bytes
    return 2 * shape.num_layers * all_reduce_time(message, world, link)


def vocab_communication_time(shape: ModelShape, world: int, link: Interconnect,
                             batch: int = 1) -> float:
    """Seconds of one decode step's vocabulary collectives: the embedding's all-reduce
    (``b x h`` values) and the logits' all-gather (``b x V``)."""
    embedding = all_reduce_time(batch * shape.hidden_bytes, world, link)
    logits = all_gather_time(batch * shape.vocab_size * shape.bytes_per_value, world, link)
    return embedding + logits
