"""Tensor parallelism inside the serving engine: rank 0 schedules, every rank computes.

    llm = LLM("smollm2", tensor_parallel_size=3)   # 3 processes, one shard each

The process that builds the engine is rank 0: it keeps the scheduler, the block manager,
the tokenizer and the samplers, exactly as with one process. It starts ``t − 1`` worker
processes (``torch.multiprocessing``, spawn), joins them in a gloo group (nccl on GPUs),
and each process loads its own shard of the checkpoint
(:func:`~minillm.parallel.loading.load_shard`) and builds its own paged KV cache, sized
from its heads: the block tables are the same on every rank, only the heads differ.

Every step, rank 0 broadcasts the step's :class:`~minillm.serve.runner.FlatBatch` (token
ids, positions, slots, block tables, copy-on-write copies) and all ranks run the same
forward pass; the collectives inside it (two all-reduces per block, the vocabulary
all-gather) keep the ranks in lockstep, and every rank ends with the full logits. Only
rank 0 samples. Closing the engine (:meth:`~minillm.serve.LLM.close`, or leaving a
``with LLM(...)`` block) sends the workers ``None`` and they exit; they are daemon
processes, so they also end with the process that started them.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..checkpoint import load_model, resolve_checkpoint
from ..config import ModelConfig
from ..model import Transformer
from ..serve.runner import FlatBatch, ModelRunner, SlotMapping
from .launch import free_port, share_cores
from .loading import load_shard
from .tensor import ShardWeight, check_split, tensor_parallel

# Workers wait for rank 0's next step inside a collective, which times out after this:
# an engine left idle longer than this needs rebuilding.
IDLE_TIMEOUT = timedelta(hours=24)


def load_rank_model(checkpoint: str, rank: int, world: int, shard_attention: bool,
                    shard: ShardWeight | None) -> Transformer:
    """This rank's model: read from its shard of the file, or, with a ``shard`` function
    of your own, cut by it from the whole model."""
    if shard is None:
        return load_shard(checkpoint, rank, world, shard_attention=shard_attention)
    return tensor_parallel(load_model(checkpoint), rank, world,
                           shard_attention=shard_attention, shard=shard)


def _rendezvous(rank: int, world: int, port: int) -> dist.TCPStore:
    """The key-value store the ranks meet at (rank 0 hosts it on 127.0.0.1:``port``)."""
    return dist.TCPStore("127.0.0.1", port, world, is_master=rank == 0, wait_for_workers=False,
                         timeout=timedelta(minutes=5))


def _join_group(store: dist.TCPStore, rank: int, world: int) -> None:
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=IDLE_TIMEOUT)


def _worker_main(index: int, world: int, port: int, checkpoint: str, shard_attention: bool,
                 shard: ShardWeight | None, num_blocks: int, block_size: int) -> None:
    """A worker rank: load its shard, say so, then run every forward pass rank 0
    broadcasts, until it sends None."""
    rank = index + 1
    store = _rendezvous(rank, world, port)
    share_cores(world)
    model = load_rank_model(checkpoint, rank, world, shard_attention, shard)
    store.set(f"loaded{rank}", "yes")
    _join_group(store, rank, world)
    try:
        runner = ModelRunner(model, num_blocks, block_size)
        while (batch := _receive()) is not None:
            runner.forward(batch)
    finally:
        dist.destroy_process_group()


def _receive() -> FlatBatch | None:
    message = [None]
    dist.broadcast_object_list(message, src=0)
    return message[0]


def _wait_until_loaded(store: dist.TCPStore, workers: mp.ProcessContext, world: int) -> None:
    """Wait for every worker's shard; a worker that failed raises its error here (and the
    others are terminated) instead of leaving rank 0 waiting in a collective."""
    keys = [f"loaded{rank}" for rank in range(1, world)]
    while not store.check(keys):
        if workers.join(timeout=0.5):  # raises if one failed; True if all exited
            raise RuntimeError("the tensor-parallel workers exited before loading")


class TensorParallelRunner(ModelRunner):
    """The engine's runner on rank 0 of ``world`` processes: it starts the workers, and
    every forward pass it runs, they run too."""

    def __init__(self, checkpoint: str, world: int, num_blocks: int, block_size: int,
                 slot_mapping: SlotMapping, *, shard_attention: bool = True,
                 shard: ShardWeight | None = None):
        if dist.is_initialized():
            raise RuntimeError("this process is already in a torch.distributed group; close "
                               "the other engine (llm.close()) first")
        checkpoint = str(resolve_checkpoint(checkpoint))
        config = ModelConfig.from_json(f"{checkpoint}/config.json")
        check_split(config.num_heads, config.num_kv_heads, config.intermediate_size,
                    config.vocab_size, world, shard_attention)
        port, self.threads = free_port(), torch.get_num_threads()
        store = _rendezvous(0, world, port)
        self.workers = mp.start_processes(
            _worker_main, nprocs=world - 1, join=False, daemon=True, start_method="spawn",
            args=(world, port, checkpoint, shard_attention, shard, num_blocks, block_size))
        model = load_rank_model(checkpoint, 0, world, shard_attention, shard)
        _wait_until_loaded(store, self.workers, world)
        _join_group(store, 0, world)
        share_cores(world)
        super().__init__(model, num_blocks, block_size, slot_mapping)

    def forward(self, batch: FlatBatch) -> torch.Tensor:
        """Send ``batch`` to the workers, then run it here with them."""
        dist.broadcast_object_list([batch], src=0)
        return super().forward(batch)

    def close(self) -> None:
        """Stop the workers and leave the process group."""
        if not dist.is_initialized():
            return
        dist.broadcast_object_list([None], src=0)
        if not self.workers.join(timeout=60):
            for process in self.workers.processes:
                process.kill()
        dist.destroy_process_group()
        torch.set_num_threads(self.threads)
