"""Tensor parallelism inside the engine: rank 0 schedules, every rank computes.

    llm = LLM("smollm2", tensor_parallel_size=3)   # 3 processes, one shard each

Rank 0 keeps the scheduler, the block manager, the tokenizer and the samplers, exactly as
with one process. Every rank loads its own shard of the checkpoint
(:func:`~minillm.parallel.loading.load_shard`) and builds its own paged KV cache, sized
from its heads: the block tables are the same on every rank, only the heads differ.

Two ways to start the ranks:

* **one machine, from Python or ``minillm serve``**: the process that builds the engine
  is rank 0 and starts ``t − 1`` workers as ``python -m minillm.engine.worker``
  processes, which meet it at a store on 127.0.0.1. They never import the caller's
  script, so ``LLM(..., tensor_parallel_size=t)`` works in a plain script without an
  ``if __name__ == "__main__":`` guard;
* **under torchrun**, on one machine or several (``torchrun --nnodes 2 ...``): torchrun
  starts every rank and the group meets at its rendezvous (``env://``). Each rank runs
  the same program; in rank 0 ``LLM(...)`` returns the engine, in the others it serves
  rank 0's steps and ends the process when rank 0 closes the engine.

Every step, rank 0 broadcasts the step's :class:`~.executors.batch.FlatBatch`
(token ids, positions, slots, block tables, copy-on-write copies) and all ranks run the
same forward pass with the same executor; the collectives inside it (two all-reduces per
block, the vocabulary all-gather) keep the ranks in lockstep, and every rank ends with the
full logits. Only rank 0 samples. Closing the engine (:meth:`~.core.EngineCore.close`,
or leaving a ``with LLM(...)`` block) sends the workers ``None`` and they exit.

**Start-up** has a budget of its own: 2 minutes for every rank to join
(``STARTUP_TIMEOUT``, :mod:`minillm.parallel.launch`) and 10 to load its shard
(``LOAD_TIMEOUT``, :mod:`.ranks`), so a busy machine that starts its ranks slowly is not
mistaken for a lost one.

**Faults.** Once started, every collective of the group times out after
``worker_timeout`` seconds, so a worker that hangs (or whose machine is unreachable) makes
rank 0's step fail instead of waiting forever; while the engine is idle rank 0 sends a
heartbeat every few seconds, so workers never wait that long for a live rank 0, and a
worker whose rank 0 is gone times out and exits. A worker process that dies closes its
connections and rank 0's step fails at once; rank 0 also watches the processes it
started, to name the one that exited. Either way the step raises
:class:`~.errors.EngineDeadError` with the reason.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import torch
import torch.distributed as dist

from ..checkpoint import resolve_checkpoint
from ..config import ModelConfig
from ..parallel.launch import (
    free_port,
    join_group_at,
    join_torchrun_group,
    set_collective_timeout,
    share_cores,
    under_torchrun,
)
from ..parallel.loading import load_rank_model
from ..parallel.tensor import ParallelLayers, ShardWeight, check_model_split
from .errors import EngineDeadError
from .executors import Executor
from .executors.batch import FlatBatch
from .ranks import (
    HEARTBEAT,
    LOAD_TIMEOUT,
    importable_name,
    layers_spec,
    loaded_key,
    serve_rank,
    wait_for_every_rank,
)
from .runner import ModelRunner, SlotMapping
from .sampler import Sampler


class TensorParallelRunner(ModelRunner):
    """The engine's runner on rank 0 of ``world`` ranks: every forward pass it runs, the
    other ranks run too. ``worker_timeout``: the seconds any collective may wait for a
    rank before the group counts as lost. ``shard`` and ``layers``: the ranks cut their
    weights with this function, or build their models from these parallel layers
    (:class:`~minillm.parallel.tensor.ParallelLayers`; eager steps only)."""

    def __init__(self, checkpoint: str, world: int, num_blocks: int, block_size: int,
                 slot_mapping: SlotMapping, *, shard_attention: bool = True,
                 shard: ShardWeight | None = None, layers: ParallelLayers | None = None,
                 worker_timeout: float = 60.0, executor: str = "auto",
                 sampler: Sampler | None = None, kv_cache_dtype: str = "float32"):
        if dist.is_initialized():
            raise RuntimeError("this process is already in a torch.distributed group; close "
                               "the other engine (llm.close()) first")
        checkpoint = str(resolve_checkpoint(checkpoint))
        config = ModelConfig.from_json(f"{checkpoint}/config.json")
        check_model_split(config, world, shard_attention, layers)
        self.threads, self.workers = torch.get_num_threads(), []
        if layers is not None:  # the native and compiled steps know only the library's layers
            executor = "eager"
        if under_torchrun():
            join_torchrun_group(world)
            if dist.get_rank() != 0:  # torchrun's other ranks serve rank 0, then end
                serve_rank(load_rank_model(checkpoint, dist.get_rank(), world,
                                           shard_attention, shard, layers),
                           num_blocks, block_size, executor, worker_timeout,
                           kv_cache_dtype=kv_cache_dtype)
                raise SystemExit(0)
        else:
            store = f"127.0.0.1:{free_port()}"
            self.workers = _start_workers(store, world, worker_timeout, checkpoint,
                                          shard_attention, shard, layers, num_blocks,
                                          block_size, executor, kv_cache_dtype)
            meeting = self._starting(lambda: join_group_at(store, 0, world))
        share_cores(world)
        model = load_rank_model(checkpoint, 0, world, shard_attention, shard, layers)
        super().__init__(model, num_blocks, block_size, slot_mapping, executor, sampler,
                         kv_cache_dtype=kv_cache_dtype)
        if self.workers:
            self._starting(lambda: self._wait_for_workers_loaded(meeting))
        self._starting(wait_for_every_rank)
        set_collective_timeout(worker_timeout)  # started: from now on, a lost rank is an error
        self.broadcasting = threading.Lock()  # one collective sequence, steps and heartbeats
        self.failure: str | None = None
        self.closed = threading.Event()
        self.heartbeat_every = max(0.5, min(5.0, worker_timeout / 4))
        threading.Thread(target=self._heartbeat, name="minillm-tp-heartbeat",
                         daemon=True).start()

    def _starting(self, phase):
        """Run a start-up phase (joining, loading, the barrier) and return what it returns;
        if a worker fails in it, stop the others and say which one (its own error is
        printed above)."""
        try:
            return phase()
        except Exception as error:  # noqa: BLE001 - reported with the failing worker
            exited = [f"worker {rank} (code {p.poll()})"
                      for rank, p in enumerate(self.workers, start=1) if p.poll() is not None]
            self._stop_workers(kill=True)
            if dist.is_initialized():
                dist.destroy_process_group()
            raise RuntimeError(
                f"the tensor-parallel ranks did not start: {', '.join(exited) or error}; "
                "the failing rank's error is printed above") from None

    def _wait_for_workers_loaded(self, meeting: dist.Store) -> None:
        """Wait for every worker's ``loaded/<rank>`` key while watching the processes: a
        worker that dies while loading (a shard function it cannot import, a missing file)
        fails the start at once, where a barrier would wait out its whole timeout."""
        keys = [loaded_key(rank) for rank in range(1, len(self.workers) + 1)]
        deadline = time.monotonic() + LOAD_TIMEOUT.total_seconds()
        while not meeting.check(keys):
            if any(process.poll() is not None for process in self.workers):
                raise RuntimeError("a worker exited while loading its shard")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the workers did not load within {LOAD_TIMEOUT}")
            time.sleep(0.05)

    def forward(self, batch: FlatBatch, executor: Executor | None = None) -> torch.Tensor:
        """Send ``batch`` to the workers, then run it here with them."""
        if self.failure is not None:
            raise EngineDeadError(self.failure)
        with self.broadcasting:
            try:
                dist.broadcast_object_list([batch], src=0)
                return super().forward(batch, executor)
            except Exception as error:  # the ranks are out of step now, whatever failed
                self.failure = self._cause(error)
                self._stop_workers(kill=True)
                raise EngineDeadError(self.failure) from error

    def _heartbeat(self) -> None:
        """While no step runs, tell the workers rank 0 is alive (so their waits for the
        next step never reach ``worker_timeout``)."""
        while not self.closed.wait(self.heartbeat_every):
            if self.broadcasting.acquire(blocking=False):
                try:
                    if self.failure is None and not self.closed.is_set():
                        dist.broadcast_object_list([HEARTBEAT], src=0)
                except Exception as error:  # noqa: BLE001 - the next step reports it
                    self.failure = self._cause(error)
                finally:
                    self.broadcasting.release()

    def _cause(self, error: Exception) -> str:
        """Why the group is lost, as a message that says what to do."""
        deadline = time.monotonic() + 2.0  # a dead worker's socket closes before it is reaped
        while time.monotonic() < deadline:
            for rank, process in enumerate(self.workers, start=1):
                if process.poll() is not None:
                    return (f"tensor-parallel worker {rank} exited (code {process.returncode});"
                            " the group cannot compute without it: restart the engine")
            if not self.workers:
                break
            time.sleep(0.05)
        if "timed out" in str(error).lower() or "timeout" in str(error).lower():
            return ("a tensor-parallel rank did not answer within worker_timeout (it hung, or "
                    "its machine is unreachable); restart the engine")
        return (f"a tensor-parallel step failed ({type(error).__name__}: {error}), leaving the "
                "ranks out of step; restart the engine")

    def _stop_workers(self, kill: bool) -> None:
        for process in self.workers:
            if kill:
                process.kill()
            try:
                process.wait(timeout=1 if kill else 60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def close(self) -> None:
        """Stop the workers and leave the process group."""
        if not dist.is_initialized():
            return
        self.closed.set()
        with self.broadcasting:
            if self.failure is None:
                dist.broadcast_object_list([None], src=0)
        self._stop_workers(kill=self.failure is not None)
        dist.destroy_process_group()
        torch.set_num_threads(self.threads)


def _start_workers(store: str, world: int, timeout: float, checkpoint: str,
                   shard_attention: bool, shard: ShardWeight | None,
                   layers: ParallelLayers | None, num_blocks: int, block_size: int,
                   executor: str, kv_cache_dtype: str) -> list[subprocess.Popen]:
    """Ranks 1 .. world - 1 as ``python -m minillm.engine.worker`` processes."""
    options = [f"--world={world}", f"--store={store}", f"--timeout={timeout}",
               f"--checkpoint={checkpoint}", f"--num-blocks={num_blocks}",
               f"--block-size={block_size}", f"--executor={executor}",
               f"--kv-cache-dtype={kv_cache_dtype}"]
    if not shard_attention:
        options.append("--replicate-attention")
    if shard is not None:
        options.append(f"--shard={importable_name(shard)}")
    if layers is not None:
        options.append(f"--layers={layers_spec(layers)}")
    # the workers import what rank 0 can (a shard function from the course's solutions/)
    path = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, sys.path))}
    return [subprocess.Popen([sys.executable, "-m", "minillm.engine.worker",
                              f"--rank={rank}", *options], env=path)
            for rank in range(1, world)]
