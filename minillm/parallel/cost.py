"""What tensor parallelism costs in communication, and when it stops paying.

Tensor parallelism (Megatron-LM, Shoeybi et al. 2019, §3) splits every layer's weights over
``t`` GPUs, and each transformer block then all-reduces its activations twice: every token
sends ``2L`` all-reduces of an ``h``-vector through the model, ``2(t - 1)`` ring steps each
(:mod:`.collectives`: the bytes, and their time in the alpha-beta model).

Decode is memory-bound (the roofline, :mod:`minillm.roofline`): a step reads every weight
once, and with ``t`` GPUs each reads only its ``1/t``. So a decode step takes about

    weights / (t x memory bandwidth)  +  2L all-reduces of b x h values  (+ the vocabulary's)

The first term shrinks like ``1/t``; the second *grows* with ``t`` (more latency steps)
and cannot be hidden, since the next layer needs the sum. Somewhere the second wins and a
larger ``t`` is slower: :func:`tp_stops_paying` finds where. With this module's numbers
that is at 8 GPUs for Llama-2-7B and 16 for Llama-2-70B on NVLink, but on Ethernet at the
first split that memory does not force. What each GPU must hold, and when a model needs
``t`` GPUs just to fit, is :mod:`.memory`.

Everything here is arithmetic from the shapes and a few hardware numbers (:mod:`.catalogue`:
nominal datasheet figures and round latency assumptions). The model is for orders of
magnitude and trends, not predictions. This module also re-exports the names of
:mod:`.catalogue`, :mod:`.collectives` and :mod:`.memory`, so ``cost.<name>`` reaches all.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..roofline import forward_flops, weight_bytes
from .catalogue import (
    ACCELERATORS,
    ETHERNET_10G,
    ETHERNET_100G,
    H100,
    INTERCONNECTS,
    LLAMA2_7B,
    LLAMA2_70B,
    MODELS,
    NVLINK3,
    NVLINK4,
    PCIE4,
    SMOLLM2_135M,
    Accelerator,
    Interconnect,
    ModelShape,
)
from .collectives import (
    all_gather_time,
    all_reduce_time,
    check_world,
    layers_communication_time,
    ring_all_gather_bytes,
    ring_all_reduce_bytes,
    ring_reduce_scatter_bytes,
    sequence_parallel_layer_bytes_per_token,
    tp_bytes_per_pass,
    tp_bytes_per_token,
    tp_layer_bytes_per_token,
    vocab_bytes_per_token,
    vocab_communication_time,
)
from .memory import (
    kv_bytes_per_token_per_gpu,
    kv_tokens_per_gpu,
    min_world_to_fit,
    model_bytes,
    weights_per_gpu,
)

__all__ = [  # this module's model, and the names of the modules below it that others use
    "ACCELERATORS", "ETHERNET_10G", "ETHERNET_100G", "H100", "INTERCONNECTS", "LLAMA2_7B",
    "LLAMA2_70B", "MODELS", "NVLINK3", "NVLINK4", "PCIE4", "SMOLLM2_135M", "Accelerator",
    "CostRow", "Interconnect", "ModelShape", "all_gather_time", "all_reduce_time",
    "communication_table", "compute_time", "decode_time", "kv_bytes_per_token_per_gpu",
    "kv_tokens_per_gpu", "layers_communication_time", "min_world_to_fit", "model_bytes",
    "ring_all_gather_bytes", "ring_all_reduce_bytes", "ring_reduce_scatter_bytes",
    "sequence_parallel_layer_bytes_per_token", "throughput", "tp_bytes_per_pass",
    "tp_bytes_per_token", "tp_layer_bytes_per_token", "tp_speedup", "tp_stops_paying",
    "vocab_bytes_per_token", "vocab_communication_time", "weights_per_gpu",
]


# --- Time of a decode step ------------------------------------------------------------------

def compute_time(shape: ModelShape, world: int, accelerator: Accelerator,
                 batch: int = 1) -> float:
    """Seconds of one rank's share of a decode step of ``batch`` tokens on the roofline:
    ``max(flops / (t peak), weight bytes / (t bandwidth))``. At small batches the bytes
    win (memory-bound): ``weights / (t x bandwidth)``. The KV cache's reads are left out
    (short contexts), so this is a lower bound."""
    check_world(world)
    config = shape.config()
    flops = forward_flops(config, new_tokens=1, batch_size=batch)
    nbytes = weight_bytes(config, shape.bytes_per_value)
    return accelerator.roofline().time(flops / world, nbytes / world)


def decode_time(shape: ModelShape, world: int, link: Interconnect, accelerator: Accelerator,
                batch: int = 1) -> float:
    """Seconds of one decode step (``batch`` sequences, one token each) on ``world``
    tensor-parallel GPUs: the rank's compute plus every collective, one after the other

        weights / (t x bandwidth) + 2L all-reduces(b h) + all-reduce(b h) + all-gather(b V)

    Memory is not checked: for a world the model does not fit in, the time is hypothetical
    (see :func:`min_world_to_fit`)."""
    return (compute_time(shape, world, accelerator, batch)
            + layers_communication_time(shape, world, link, batch)
            + vocab_communication_time(shape, world, link, batch))


def tp_speedup(shape: ModelShape, world: int, link: Interconnect, accelerator: Accelerator,
               batch: int = 1) -> float:
    """How many times faster a decode step is on ``world`` GPUs than on one (hypothetical
    when the model does not fit in one)."""
    one = decode_time(shape, 1, link, accelerator, batch)
    return one / decode_time(shape, world, link, accelerator, batch)


def tp_stops_paying(shape: ModelShape, link: Interconnect, accelerator: Accelerator,
                    batch: int = 1, worlds=(1, 2, 4, 8, 16)) -> int | None:
    """The first of ``worlds`` (ascending) whose decode step is not faster than the one
    before, among the worlds whose share of the weights fits in the accelerator's memory;
    None if every step is faster.

    Doubling ``t`` saves ``weights / (2 t bandwidth)`` of reading and adds ``2t`` latency
    steps to each of the ~2L all-reduces: it pays while ``t^2 < weights / (8 L alpha
    bandwidth)``. Llama-2-7B on H100 and NVLink (alpha 1 µs): t < 3.9, so 4 -> 8 does not."""
    for world in worlds:
        check_world(world)
    worlds = sorted(worlds)
    fitting = [w for w in worlds if weights_per_gpu(shape, w) <= accelerator.memory_bytes]
    times = [decode_time(shape, w, link, accelerator, batch) for w in fitting]
    for previous, world, time in zip(times, fitting[1:], times[1:], strict=False):
        if time >= previous:
            return world
    return None


def throughput(shape: ModelShape, gpus: int, world: int, link: Interconnect,
               accelerator: Accelerator, batch: int = 1) -> float:
    """Tokens per second of ``gpus`` GPUs serving ``gpus / world`` data-parallel replicas,
    each tensor-parallel over ``world`` GPUs with ``batch`` sequences. Replicas do not
    communicate at inference, so throughput is replicas x batch / step time; tensor
    parallelism shortens the step (latency) but leaves fewer replicas."""
    check_world(world)
    if gpus % world:
        raise ValueError(f"{gpus} GPUs do not split into replicas of {world}")
    if weights_per_gpu(shape, world) > accelerator.memory_bytes:
        raise ValueError(f"{shape.name} does not fit in {world} x {accelerator.name} "
                         f"({weights_per_gpu(shape, world) / 1e9:.0f} GB per GPU); use at "
                         f"least {min_world_to_fit(shape, accelerator.memory_bytes)}")
    replicas = gpus // world
    return replicas * batch / decode_time(shape, world, link, accelerator, batch)


# --- The table ------------------------------------------------------------------------------

@dataclass(frozen=True)
class CostRow:
    """One model on one link at one world size (``link`` is None for world 1)."""

    model: str
    link: str | None
    world: int
    batch: int
    layer_bytes: float  # per token, per block, sent by each rank
    model_bytes: float  # per token, all blocks (vocabulary collectives not included)
    vocab_bytes: float  # per token, embedding all-reduce + logits all-gather
    all_reduce_seconds: float  # one all-reduce of the step's b x h message
    communication_seconds: float  # all of a decode step's collectives
    compute_seconds: float  # the rank's share of the weights (or FLOPs)
    step_seconds: float
    speedup: float  # over one GPU, hypothetical when that does not fit
    fits: bool  # the world's share of the weights fits in one accelerator


def communication_table(shapes=(LLAMA2_7B, LLAMA2_70B), worlds=(1, 2, 4, 8),
                        links=(NVLINK4, PCIE4, ETHERNET_100G, ETHERNET_10G),
                        accelerator: Accelerator = H100, batch: int = 1) -> list[CostRow]:
    """Rows for every shape x link x world (world 1 once per shape, without a link): the
    bytes, the times of a decode step and the speedup over one GPU. A model that does not
    fit in one GPU gets ``fits=False`` rows; their times, and every speedup over them,
    assume a GPU with enough memory (a hypothetical baseline, to show the trend)."""
    rows = []
    for shape in shapes:
        for link in links:
            for world in worlds:
                if world == 1 and link is not links[0]:
                    continue
                message = batch * shape.hidden_bytes
                communication = (layers_communication_time(shape, world, link, batch)
                                 + vocab_communication_time(shape, world, link, batch))
                rows.append(CostRow(
                    model=shape.name, link=None if world == 1 else link.name, world=world,
                    batch=batch, layer_bytes=tp_layer_bytes_per_token(shape, world),
                    model_bytes=tp_bytes_per_token(shape, world),
                    vocab_bytes=vocab_bytes_per_token(shape, world),
                    all_reduce_seconds=all_reduce_time(message, world, link),
                    communication_seconds=communication,
                    compute_seconds=compute_time(shape, world, accelerator, batch),
                    step_seconds=decode_time(shape, world, link, accelerator, batch),
                    speedup=tp_speedup(shape, world, link, accelerator, batch),
                    fits=weights_per_gpu(shape, world) <= accelerator.memory_bytes))
    return rows
