"""What the ranks of a tensor-parallel engine share: rank 0
(:class:`~.parallel_runner.TensorParallelRunner`) and every worker rank, whether
:mod:`.worker` started it or torchrun did.

A worker rank runs :func:`serve_rank`: it builds its runner, says so under
:func:`loaded_key` in rank 0's store, passes the loading barrier, then runs every forward
pass rank 0 broadcasts (:data:`HEARTBEAT` when rank 0 is idle) until it sends None.
Functions reach a worker process by name: :func:`importable_name` and
:func:`layers_spec` write them on rank 0's side, :func:`shard_function` and
:func:`parallel_layers` import them on the worker's. The worker's command line is
:mod:`.worker`, which this package never imports: ``python -m minillm.engine.worker``
then runs it without runpy's warning that the module was imported before it ran.
"""

from __future__ import annotations

import importlib
from datetime import timedelta
from types import SimpleNamespace

import torch.distributed as dist

from ..model import Transformer
from ..parallel.launch import set_collective_timeout
from ..parallel.tensor import ParallelLayers, ShardWeight
from .executors.batch import FlatBatch
from .runner import ModelRunner

HEARTBEAT = "heartbeat"  # what rank 0 broadcasts to an idle group
LOAD_TIMEOUT = timedelta(minutes=10)  # for every rank to load its shard
LAYER_PARTS = ("parallel_block", "VocabParallelEmbedding", "ParallelLMHead")  # ParallelLayers


def wait_for_every_rank() -> None:
    """The loading barrier: a rank that failed to load makes it fail, naming the rank."""
    dist.monitored_barrier(timeout=LOAD_TIMEOUT)


def loaded_key(rank: int) -> str:
    """The store key a worker started by rank 0 sets once its runner is built."""
    return f"loaded/{rank}"


def serve_rank(model: Transformer, num_blocks: int, block_size: int, executor: str,
               timeout: float, meeting: dist.Store | None = None,
               kv_cache_dtype: str = "float32") -> None:
    """Be a worker rank (group joined, model loaded): build the runner (its executors may
    compile kernels), say so in rank 0's store ``meeting`` if it started this process,
    pass the loading barrier, then, each collective timing out after ``timeout`` seconds,
    run every forward pass rank 0 broadcasts, until it sends None. Its pool, of
    ``kv_cache_dtype``, holds its own KV heads."""
    try:
        runner = ModelRunner(model, num_blocks, block_size, executor=executor,
                             kv_cache_dtype=kv_cache_dtype)
        if meeting is not None:
            meeting.set(loaded_key(dist.get_rank()), "yes")
        wait_for_every_rank()
        set_collective_timeout(timeout)
        while (message := _receive()) is not None:
            if message != HEARTBEAT:
                runner.forward(message)
    finally:
        dist.destroy_process_group()


def _receive() -> FlatBatch | str | None:
    message = [None]
    dist.broadcast_object_list(message, src=0)
    return message[0]


def importable_name(function) -> str:
    """``module:name`` of a function (or class) a worker process can import, or a clear
    error."""
    module, name = function.__module__, function.__qualname__
    if module == "__main__" or "<" in name:
        raise ValueError(f"{name!r} must be importable from a module (it runs in the worker "
                         "processes): define it in a .py file, not in a script's main "
                         "module, a notebook cell or a lambda")
    return f"{module}:{name}"


def layers_spec(layers: ParallelLayers) -> str:
    """The parts of ``layers`` (a module or namespace) by name, as
    ``part=module:name,...``: how they reach the worker processes."""
    return ",".join(f"{part}={importable_name(getattr(layers, part))}" for part in LAYER_PARTS)


def shard_function(spec: str | None) -> ShardWeight | None:
    """A ``module:name`` spec, imported (a worker process gets functions by name)."""
    if not spec:
        return None
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def parallel_layers(spec: str | None) -> ParallelLayers | None:
    """The parts :func:`layers_spec` named, each imported."""
    if not spec:
        return None
    return SimpleNamespace(**{part: shard_function(name) for part, name in
                              (item.split("=", 1) for item in spec.split(","))})
