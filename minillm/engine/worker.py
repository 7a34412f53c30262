"""A tensor-parallel worker rank: loads its shard and runs every step rank 0 broadcasts.

    python -m minillm.engine.worker --rank 1 --world 2 --store 127.0.0.1:29500 \\
        --checkpoint DIR --num-blocks 1024 --block-size 16

The engine's rank 0 (:class:`~.parallel_runner.TensorParallelRunner`) starts one such
process per other rank. They are started as ``python -m`` of this module, not with
multiprocessing's *spawn*, which imports the caller's main module again in every child: a
script without an ``if __name__ == "__main__":`` guard would then build engines in its
workers. Under torchrun, every rank is started by torchrun instead, and ranks other than 0
call :func:`serve_rank` from the engine's constructor.
"""

from __future__ import annotations

import argparse
import importlib
from datetime import timedelta
from types import SimpleNamespace

import torch.distributed as dist

from ..model import Transformer
from ..parallel.launch import join_group_at, set_collective_timeout, share_cores
from ..parallel.loading import load_rank_model
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
               timeout: float, meeting: dist.Store | None = None) -> None:
    """Be a worker rank (group joined, model loaded): build the runner (its executors may
    compile kernels), say so in rank 0's store ``meeting`` if it started this process,
    pass the loading barrier, then, each collective timing out after ``timeout`` seconds,
    run every forward pass rank 0 broadcasts, until it sends None."""
    try:
        runner = ModelRunner(model, num_blocks, block_size, executor=executor)
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--store", required=True, help="host:port of rank 0's store")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds a collective may wait for another rank")
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--replicate-attention", action="store_true")
    parser.add_argument("--shard", default=None, help="module:function cutting each weight")
    parser.add_argument("--layers", default=None,
                        help="part=module:name,... of the parallel layers to build from")
    parser.add_argument("--num-blocks", type=int, required=True)
    parser.add_argument("--block-size", type=int, required=True)
    parser.add_argument("--executor", default="auto")
    args = parser.parse_args(argv)
    meeting = join_group_at(args.store, args.rank, args.world)
    share_cores(args.world)
    model = load_rank_model(args.checkpoint, args.rank, args.world,
                            not args.replicate_attention, shard_function(args.shard),
                            parallel_layers(args.layers))
    serve_rank(model, args.num_blocks, args.block_size, args.executor, args.timeout, meeting)


if __name__ == "__main__":
    main()
