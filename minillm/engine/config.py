"""Everything an engine is built from, in one dataclass.

:class:`EngineConfig` gathers the engine's sizes and options: the paged pool, the
scheduler, the executor, tensor parallelism, speculation, structured output, and the
seams through which the course's labs put the learner's parts inside the real engine
(``block_manager``, ``slot_mapping``, ``decode_attention``, ``verifier``, ``shard_weight``,
``parallel_layers``, ``structured_backend``, and the scheduler's ``plan`` and
``preempt``). ``LLM(model, **options)`` accepts the same names as keywords.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..attention.kv_quant import kv_cache_dtype_of
from ..attention.paged import slot_mapping as default_slot_mapping
from ..draft_head.head import DraftHead
from ..model import Transformer
from ..parallel.tensor import ParallelLayers, ShardWeight
from ..structured.backend import XGrammarBackend
from .block_manager import BlockManager
from .executors import EXECUTORS
from .executors.batch import SlotMapping
from .paged_cache import DecodeAttention
from .scheduler import SchedulerConfig
from .structured import BackendFactory

Verifier = Callable  # minillm.speculative.verify's signature (chapter 11 passes the learner's)


@dataclass
class EngineConfig:
    """The engine's options.

    ``num_blocks`` blocks of ``block_size`` token slots make the paged KV pool
    (``prefix_caching``: reuse full blocks of earlier prompts); ``scheduler``: batching
    policy, token budget, speculation (:class:`~.scheduler.SchedulerConfig`); ``executor``:
    auto, eager, compiled or native (:mod:`.executors`). ``tensor_parallel_size`` > 1 runs
    the forward passes on that many processes (``shard_attention``, ``worker_timeout``:
    :mod:`.parallel_runner`). ``draft_model``: a smaller model guessing for speculation
    (with ``scheduler.speculative_tokens`` >= 1); ``draft_head``: instead, an EAGLE head
    over the target's hidden states (:mod:`minillm.draft_head`: a module or the directory
    ``minillm train-draft-head`` wrote). ``structured_backend`` builds the
    constraint backend (chapter 16); ``jump_forward`` appends the tokens a grammar forces
    without a forward pass each. The seams: ``block_manager`` (an instance, used instead of
    one built from the sizes), ``slot_mapping``, ``decode_attention``, ``verifier``,
    ``shard_weight``, ``parallel_layers`` (a module or namespace of tensor-parallel layers,
    :class:`~minillm.parallel.tensor.ParallelLayers`, that every rank builds its model from;
    they run in the eager executor). ``kv_cache_dtype``: how the paged pool stores keys and
    values, float32 (None) or int8 (a scale per token and KV head,
    :mod:`minillm.attention.kv_quant`): 3.8x the tokens in the same bytes."""

    block_size: int = 16
    num_blocks: int = 1024
    prefix_caching: bool = True
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    executor: str = "auto"
    tensor_parallel_size: int = 1
    shard_attention: bool = True
    worker_timeout: float = 60.0
    draft_model: str | Transformer | None = None
    draft_head: str | Path | DraftHead | None = None
    structured_backend: BackendFactory = XGrammarBackend
    jump_forward: bool = False
    block_manager: BlockManager | None = None
    slot_mapping: SlotMapping = default_slot_mapping
    decode_attention: DecodeAttention | None = None
    kv_cache_dtype: str | None = None
    verifier: Verifier | None = None
    shard_weight: ShardWeight | None = None
    parallel_layers: ParallelLayers | None = None

    def __post_init__(self):
        self.kv_cache_dtype = kv_cache_dtype_of(self.kv_cache_dtype)
        if self.kv_cache_dtype != "float32" and self.decode_attention is not None:
            raise ValueError("decode_attention= reads a float32 pool: leave kv_cache_dtype "
                             "at None to run it")
        if self.executor not in EXECUTORS:
            raise ValueError(f"executor must be one of {', '.join(EXECUTORS)}, got "
                             f"{self.executor!r}")
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be at least 1, got "
                             f"{self.tensor_parallel_size}")
        if self.tensor_parallel_size > 1 and self.decode_attention is not None:
            raise ValueError("decode_attention= runs in one process: leave "
                             "tensor_parallel_size at 1")
        if self.parallel_layers is not None and self.tensor_parallel_size < 2:
            raise ValueError("parallel_layers= are the layers of tensor-parallel ranks: give "
                             "tensor_parallel_size >= 2 too")
        if self.parallel_layers is not None and self.executor in ("compiled", "native"):
            raise ValueError(f"parallel_layers= run in the eager executor (the {self.executor} "
                             "one knows only the library's layers): leave executor='auto'")
        if self.draft_model is not None and self.scheduler.speculative_tokens < 1:
            raise ValueError("a draft model guesses for speculative decoding: give "
                             "SchedulerConfig(speculative_tokens=γ) with γ >= 1")
        if self.draft_head is not None:
            self._check_draft_head()

    def _check_draft_head(self) -> None:
        if self.scheduler.speculative_tokens < 1:
            raise ValueError("a draft head guesses for speculative decoding: give "
                             "SchedulerConfig(speculative_tokens=γ) with γ >= 1")
        if self.draft_model is not None:
            raise ValueError("give a draft_model or a draft_head, not both")
        if self.tensor_parallel_size > 1:
            raise ValueError("a draft head runs beside a target in one process: leave "
                             "tensor_parallel_size at 1")
        if self.executor == "compiled":
            raise ValueError("a draft head reads the target's hidden states, which compiled "
                             "decode graphs do not return: use executor='auto', 'native' or "
                             "'eager'")

    def make_block_manager(self) -> BlockManager:
        return self.block_manager or BlockManager(self.num_blocks, self.block_size,
                                                  self.prefix_caching)
