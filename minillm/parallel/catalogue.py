"""The models and hardware the cost model of :mod:`minillm.parallel.cost` is run on.

Model shapes are the published configurations; the hardware presets are nominal datasheet
figures and the link latencies round assumptions (see :class:`Interconnect`): good for
orders of magnitude and trends, not for predictions.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import ModelConfig
from ..roofline import Roofline

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

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def hidden_bytes(self) -> int:
        """Bytes of one token's hidden vector: the message of tensor parallelism's
        all-reduces is ``b x`` this for ``b`` tokens."""
        return self.hidden_size * self.bytes_per_value

    def config(self) -> ModelConfig:
        """The :class:`ModelConfig` of this shape (for the parameter, FLOP and KV counts)."""
        return ModelConfig(vocab_size=self.vocab_size, hidden_size=self.hidden_size,
                           intermediate_size=self.intermediate_size,
                           num_layers=self.num_layers, num_heads=self.num_heads,
                           num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
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
