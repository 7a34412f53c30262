"""What tensor parallelism costs in communication, and when it stops paying.

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

Decode is memory-bound (the roofline, :mod:`minillm.roofline`): a step reads every weight
once, and with ``t`` GPUs each reads only its ``1/t``. So a decode step takes about

    weights / (t x memory bandwidth)  +  2L all-reduces of b x h values  (+ the vocabulary's)

The first term shrinks like ``1/t``; the second *grows* with ``t`` (more latency steps)
and cannot be hidden, since the next layer needs the sum. Somewhere the second wins and a
larger ``t`` is slower: :func:`tp_stops_paying` finds where. With this module's numbers
that is at 8 GPUs for Llama-2-7B and 16 for Llama-2-70B on NVLink, but on Ethernet at the
first split that memory does not force.

Sequence parallelism (Korthikanti et al. 2022) replaces each all-reduce by a
reduce-scatter and an all-gather around the norms: the same bytes
(:func:`sequence_parallel_layer_bytes_per_token`), less activation memory.

Data parallelism needs no communication at inference: ``r`` replicas serve ``r`` times the
requests. But each replica must hold the whole model, and Llama-2-70B in fp16 (138 GB) does
not fit in one 80 GB GPU: there tensor parallelism is needed for memory, not only speed
(:func:`min_world_to_fit`).

Everything here is arithmetic from the shapes and a few hardware numbers: the hardware
presets are nominal datasheet figures, the latencies round assumptions (see
:class:`Interconnect`). The model is for orders of magnitude and trends, not predictions.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from ..config import ModelConfig
from ..roofline import Roofline, forward_flops, weight_bytes


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


# --- Model shapes ---------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelShape:
    """The sizes that set a Llama-family model's communication and weight bytes.

    ``bytes_per_value`` is the width of the activations sent and of the weights read
    (2: fp16/bf16 on a GPU; 4: fp32, as this course runs SmolLM2 on a CPU)."""

    name: str
    hidden_size: int
    num_layers: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int
    bytes_per_value: int = 2
    tie_word_embeddings: bool = False

    def config(self) -> ModelConfig:
        """The :class:`ModelConfig` of this shape (for the parameter and FLOP counts)."""
        return ModelConfig(vocab_size=self.vocab_size, hidden_size=self.hidden_size,
                           intermediate_size=self.intermediate_size,
                           num_layers=self.num_layers, num_heads=self.num_heads,
                           num_kv_heads=self.num_kv_heads,
                           head_dim=self.hidden_size // self.num_heads,
                           tie_word_embeddings=self.tie_word_embeddings)

    @classmethod
    def from_config(cls, name: str, config: ModelConfig, bytes_per_value: int = 4) -> ModelShape:
        """The shape of a loaded model's config (``bytes_per_value`` 4: fp32 on a CPU)."""
        return cls(name, config.hidden_size, config.num_layers, config.intermediate_size,
                   config.num_heads, config.num_kv_heads, config.vocab_size, bytes_per_value,
                   config.tie_word_embeddings)


# Touvron et al. 2023 (Llama 2), Table 1 and the released config.json files.
LLAMA2_7B = ModelShape("Llama-2-7B", hidden_size=4096, num_layers=32, intermediate_size=11008,
                       num_heads=32, num_kv_heads=32, vocab_size=32000)
LLAMA2_70B = ModelShape("Llama-2-70B", hidden_size=8192, num_layers=80,
                        intermediate_size=28672, num_heads=64, num_kv_heads=8,
                        vocab_size=32000)
SMOLLM2_135M = ModelShape("SmolLM2-135M", hidden_size=576, num_layers=30, intermediate_size=1536,
                          num_heads=9, num_kv_heads=3, vocab_size=49152, bytes_per_value=4,
                          tie_word_embeddings=True)
MODELS = {shape.name: shape for shape in (LLAMA2_7B, LLAMA2_70B, SMOLLM2_135M)}


# --- Bytes per token ------------------------------------------------------------------------

def tp_layer_bytes_per_token(shape: ModelShape, world: int) -> float:
    """Bytes each rank sends per token in one transformer block under tensor parallelism:
    two all-reduces (attention's and the MLP's, Megatron §3) of an ``h``-vector,
    ``2 x 2(t - 1)/t x h x bytes``. Llama-2-7B at t = 2: 2 x 1 x 4096 x 2 = 16,384."""
    return 2 * ring_all_reduce_bytes(shape.hidden_size * shape.bytes_per_value, world)


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
    embedding = ring_all_reduce_bytes(shape.hidden_size * shape.bytes_per_value, world)
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
    message = shape.hidden_size * shape.bytes_per_value
    both = ring_reduce_scatter_bytes(message, world) + ring_all_gather_bytes(message, world)
    return 2 * both


# --- Hardware -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Interconnect:
    """A link between GPUs in the alpha-beta model: ``bandwidth`` in bytes/s that one GPU
    can send (per direction; a ring sends and receives at once) and ``latency``, the
    seconds of one step of a ring collective (alpha)."""

    name: str
    bandwidth: float
    latency: float


# Bandwidths: nominal per-direction datasheet figures (NVIDIA's H100 and A100 datasheets:
# 900 and 600 GB/s total NVLink bandwidth, half each way; PCIe 4.0 x16 is 31.5 GB/s raw
# per direction, of which ~25 GB/s is what transfers reach; Ethernet's line rate / 8).
# Measured all-reduce "bus bandwidth" is lower than these nominal figures.
#
# Latencies: round numbers, assumptions of this model, not measurements. NCCL's own cost
# model (src/graph/tuning.cc) charges a ring all-reduce a base latency of a few µs plus a
# per-step hop latency of the order of 1 µs on NVLink or PCIe and several µs across a
# network; we fold everything into alpha per step. Ethernet rows assume TCP sockets (what
# gloo and NCCL's socket transport use without RDMA), where one message's round of kernel
# network stack, NIC and switch costs tens of µs. With these, one all-reduce at t = 2
# (2 steps) costs ~2 µs on NVLink, ~10 µs on PCIe, ~50-100 µs over Ethernet.
NVLINK4 = Interconnect("NVLink 4", bandwidth=450e9, latency=1e-6)
NVLINK3 = Interconnect("NVLink 3", bandwidth=300e9, latency=1e-6)
PCIE4 = Interconnect("PCIe 4 x16", bandwidth=25e9, latency=5e-6)
ETHERNET_100G = Interconnect("100 GbE", bandwidth=12.5e9, latency=25e-6)
ETHERNET_10G = Interconnect("10 GbE", bandwidth=1.25e9, latency=50e-6)
INTERCONNECTS = (NVLINK4, NVLINK3, PCIE4, ETHERNET_100G, ETHERNET_10G)


@dataclass(frozen=True)
class Accelerator:
    """A GPU's memory bandwidth (bytes/s), memory (bytes) and dense fp16 FLOP/s."""

    name: str
    memory_bandwidth: float
    memory_bytes: float
    peak_flops: float

    def roofline(self) -> Roofline:
        return Roofline(self.peak_flops, self.memory_bandwidth)


# NVIDIA datasheets: H100 SXM5 80 GB (HBM3 3.35 TB/s, 989 dense fp16 TFLOP/s) and A100 SXM4
# 80 GB (HBM2e 2.0 TB/s, 312 dense fp16 TFLOP/s). Memory in decimal GB, as sold.
H100 = Accelerator("H100", memory_bandwidth=3.35e12, memory_bytes=80e9, peak_flops=989e12)
A100 = Accelerator("A100", memory_bandwidth=2.0e12, memory_bytes=80e9, peak_flops=312e12)
ACCELERATORS = {accelerator.name: accelerator for accelerator in (H100, A100)}


# --- Memory: does it fit? -------------------------------------------------------------------

def model_bytes(shape: ModelShape) -> int:
    """Bytes of all the weights (every parameter, embeddings included)."""
    return shape.config().num_parameters() * shape.bytes_per_value


def weights_per_gpu(shape: ModelShape, world: int) -> float:
    """Bytes of weights each of ``world`` tensor-parallel GPUs holds: ``1/t`` of them (the
    norms, replicated, are negligible)."""
    check_world(world)
    return model_bytes(shape) / world


def kv_bytes_per_token_per_gpu(shape: ModelShape, world: int) -> float:
    """KV-cache bytes one token costs each of ``world`` GPUs: its keys and values in every
    layer, for the KV heads this GPU holds (``1/t`` of them; a KV head is never split, so
    ``t`` beyond the KV heads replicates them)."""
    check_world(world)
    heads = max(shape.num_kv_heads / world, 1)
    head_dim = shape.hidden_size // shape.num_heads
    return 2 * shape.num_layers * heads * head_dim * shape.bytes_per_value


def kv_tokens_per_gpu(shape: ModelShape, world: int, memory_bytes: float,
                      usable: float = 0.9) -> int:
    """Tokens of KV cache each GPU can hold once its share of the weights is in: the
    batch headroom tensor parallelism buys. ``usable``: the share of memory the server may
    fill (vLLM's ``gpu_memory_utilization``, 0.9 by default); activations are ignored.
    0 when the weights alone do not fit."""
    free = usable * memory_bytes - weights_per_gpu(shape, world)
    return max(0, int(free // kv_bytes_per_token_per_gpu(shape, world)))


def min_world_to_fit(shape: ModelShape, memory_bytes: float) -> int:
    """The fewest GPUs of ``memory_bytes`` each whose memory holds the weights split ``t``
    ways: ``ceil(weights / memory)``. A lower bound: the KV cache and activations need
    room too, and a real split needs ``t`` to divide the heads (so 3 becomes 4).
    Llama-2-70B in fp16 (138 GB) on 80 GB GPUs: 2."""
    if memory_bytes <= 0:
        raise ValueError(f"memory must be positive, got {memory_bytes} bytes")
    return max(1, math.ceil(model_bytes(shape) / memory_bytes))


# --- Time -----------------------------------------------------------------------------------

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
    message = batch * shape.hidden_size * shape.bytes_per_value
    return 2 * shape.num_layers * all_reduce_time(message, world, link)


def vocab_communication_time(shape: ModelShape, world: int, link: Interconnect,
                             batch: int = 1) -> float:
    """Seconds of one decode step's vocabulary collectives: the embedding's all-reduce
    (``b x h`` values) and the logits' all-gather (``b x V``)."""
    embedding = all_reduce_time(batch * shape.hidden_size * shape.bytes_per_value, world, link)
    logits = all_gather_time(batch * shape.vocab_size * shape.bytes_per_value, world, link)
    return embedding + logits


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
                message = batch * shape.hidden_size * shape.bytes_per_value
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
