"""The compiled executor: decode-only steps through a ``torch.compile`` graph per batch bucket.

A compiled graph has fixed shapes. A decode step's shapes are its number of sequences and
the width of its block tables, so this executor fixes both:

* the batch is padded up to the next **bucket** (1, 2, 4, 8, 16, 32): a step of 3
  sequences runs the 4-sequence graph. A padding row has token 0, position 0, context
  length 0 and **slot -1**, so it writes nothing into the pool and attends to nothing;
  its logits are dropped;
* block tables are as wide as the longest sequence the model allows (its context / block
  size): only the first ``ceil(length / block_size)`` entries of a row are read.

Its inputs live in persistent buffers, one set per bucket, filled in place each step, and a
bucket's graph is compiled the first time a step needs it (nano-vllm captures CUDA graphs
the same way; compiling takes seconds for a tiny model and a minute or two for SmolLM2 on
2 cores). After warm-up the number of graphs stays at the number of buckets used: a
dynamic shape sneaking in would compile again every step (``tests/test_executors.py``
counts them).

Inside the graph the model runs its own modules, with every float32 linear layer written
as one sum per output row at up to four rows
(:class:`~minillm.compile.MatVecLinear`, the formulation Inductor turns into one
streaming loop) and the weight-only int8/int4 layers' own reduction; attention is one
opaque op per layer, ``minillm::paged_decode_attention`` (C++: it writes the new keys and
values at their slots and reads the pool through the block tables), which Inductor calls
in place on the pool.
"""

from __future__ import annotations

import torch

from ... import ops
from ...compile import NO_MODULE_GUARDS, MatVecLinear, realize_rules, with_own_code
from ...linear import CompressedLinear
from ...model import Transformer
from ...native import native_kernels
from ...parallel.layers import RowParallelLinear
from ...quant.int8_activations import Int8ActivationLinear
from ...quant.w4a8 import W4A8Linear
from ...quant.weight_only import WeightOnlyLinear
from ..paged_cache import AttentionMetadata, PagedKVCache
from .batch import FlatBatch

BUCKETS = (1, 2, 4, 8, 16, 32)
COMPILED_LAYERS = (torch.nn.Linear, MatVecLinear, WeightOnlyLinear, Int8ActivationLinear,
                   W4A8Linear)


def compile_problem(model: Transformer) -> str | None:
    """Why ``model``'s decode steps cannot be compiled here, or None."""
    if model.config.moe is not None:
        return ("its mixture-of-experts layers group the tokens by expert, in shapes the "
                "routing decides at run time; the compiled graphs take fixed ones")
    if model.config.has_windows():
        return ("its decode attention (minillm::paged_decode_attention) has no sliding "
                f"window, which this {model.config.family} model's layers need")
    for name, module in model.named_modules():
        if isinstance(module, (torch.nn.Linear, CompressedLinear)) and \
                type(module) not in COMPILED_LAYERS:
            return (f"{name} is a {type(module).__name__}; compiled steps take float "
                    "nn.Linear, weight-only int8/int4 and int8-activation layers")
    if any(isinstance(module, RowParallelLinear) for module in model.modules()):
        return "a tensor-parallel rank's collectives do not run inside a compiled graph"
    if native_kernels() is None:  # no C++ compiler here: Inductor needs one too
        return "there is no working C++ compiler on this machine (see the warning)"
    return None


def bucket_for(batch_size: int) -> int:
    """The smallest bucket that holds ``batch_size`` sequences."""
    return next(b for b in BUCKETS if b >= batch_size)


class DecodeView:
    """The paged pool as a compiled decode step sees it: every layer's attention is one
    call of ``minillm::paged_decode_attention`` on that layer's pool."""

    def __init__(self, keys, values, slots, block_tables, context_lens):
        self.keys, self.values = keys, values
        self.slots, self.block_tables, self.context_lens = slots, block_tables, context_lens

    def attend(self, layer: int, q, k, v, mask=None, backend=None) -> torch.Tensor:
        """q [1, heads, seqs, head_dim], k/v [1, kv_heads, seqs, head_dim] -> like q."""
        out = ops.paged_decode_attention(
            q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), self.keys[layer],
            self.values[layer], self.slots, self.block_tables, self.context_lens)
        return out.transpose(0, 1)[None]


def _decode_step(model: Transformer, token_ids, positions, slots, block_tables, context_lens,
                 keys, values) -> torch.Tensor:
    """One decode step: logits [seqs, vocab] of each sequence's new token."""
    view = DecodeView(keys, values, slots, block_tables, context_lens)
    return model.forward_flat(token_ids, positions, view)


class Buffers:
    """The persistent inputs of one bucket's graph."""

    def __init__(self, bucket: int, width: int, device):
        self.token_ids = torch.zeros(bucket, dtype=torch.long, device=device)
        self.positions = torch.zeros(bucket, dtype=torch.long, device=device)
        self.slots = torch.full((bucket,), -1, dtype=torch.long, device=device)
        self.block_tables = torch.zeros(bucket, width, dtype=torch.long, device=device)
        self.context_lens = torch.zeros(bucket, dtype=torch.long, device=device)

    def fill(self, batch: FlatBatch) -> None:
        """This step's inputs, padding rows after them."""
        meta, n = batch.metadata, len(batch.token_ids)
        width = meta.block_tables.shape[1]
        self.token_ids[:n] = batch.token_ids
        self.positions[:n] = batch.positions
        self.slots[:n] = meta.slot_mapping
        self.slots[n:] = -1
        self.block_tables[:n, :width] = meta.block_tables
        self.context_lens[:n] = meta.context_lens
        self.context_lens[n:] = 0


class CompiledExecutor:
    """Decode-only steps of up to 32 sequences through compiled graphs (module docstring).
    It runs the model as given: prepared for it (:func:`minillm.prepare.prepare_model`),
    its float32 linears have the one-sum-per-row formulation
    (:class:`~minillm.compile.MatVecLinear`: the same parameters and numbers)."""

    name = "compiled"

    def __init__(self, model: Transformer, cache: PagedKVCache):
        if (problem := compile_problem(model)) is not None:
            raise ValueError(f"no compiled decode steps for this model: {problem}")
        if cache.quantized:
            raise ValueError(f"compiled decode steps read float32 KV pools, not "
                             f"{cache.kv_cache_dtype}: use the native or eager executor")
        self.model, self.cache = model, cache
        config = model.config
        self.width = -(-config.max_position_embeddings // cache.block_size)
        self.buffers: dict[int, Buffers] = {}
        freezing = not any(isinstance(m, CompressedLinear) for m in model.modules())
        self.step = torch.compile(with_own_code(_decode_step), fullgraph=True, dynamic=False,
                                  options={"freezing": freezing, **realize_rules(model),
                                           "guard_filter_fn": NO_MODULE_GUARDS})

    def supports(self, metadata: AttentionMetadata) -> bool:
        return metadata.decode_only and len(metadata.query_lens) <= BUCKETS[-1]

    def __call__(self, batch: FlatBatch) -> torch.Tensor:
        n = len(batch.token_ids)
        bucket = bucket_for(n)
        if bucket not in self.buffers:
            self.buffers[bucket] = Buffers(bucket, self.width, batch.token_ids.device)
        buffers = self.buffers[bucket]
        buffers.fill(batch)
        logits = self.step(self.model, buffers.token_ids, buffers.positions, buffers.slots,
                           buffers.block_tables, buffers.context_lens, self.cache.keys,
                           self.cache.values)
        return logits[batch.logits_at]  # not the padding rows (nor a 1-token chunk's)
