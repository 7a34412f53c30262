"""A tensor-parallel worker rank: loads its shard and runs every step rank 0 broadcasts.

    python -m minillm.engine.worker --rank 1 --world 2 --store 127.0.0.1:29500 \\
        --checkpoint DIR --num-blocks 1024 --block-size 16

The engine's rank 0 (:class:`~.parallel_runner.TensorParallelRunner`) starts one such
process per other rank. They are started as ``python -m`` of this module, not with
multiprocessing's *spawn*, which imports the caller's main module again in every child: a
script without an ``if __name__ == "__main__":`` guard would then build engines in its
workers. Under torchrun, every rank is started by torchrun instead, and ranks other than 0
call :func:`~.ranks.serve_rank` from the engine's constructor.

This module is only the command line: the package never imports it (what the ranks
share is :mod:`.ranks`), so ``python -m`` runs it without runpy's warning that
``minillm.engine.worker`` was already imported.
"""

from __future__ import annotations

import argparse

from ..parallel.launch import join_group_at, share_cores
from ..parallel.loading import load_rank_model
from .ranks import parallel_layers, serve_rank, shard_function


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
    parser.add_argument("--kv-cache-dtype", default="float32")
    args = parser.parse_args(argv)
    meeting = join_group_at(args.store, args.rank, args.world)
    share_cores(args.world)
    model = load_rank_model(args.checkpoint, args.rank, args.world,
                            not args.replicate_attention, shard_function(args.shard),
                            parallel_layers(args.layers))
    serve_rank(model, args.num_blocks, args.block_size, args.executor, args.timeout, meeting,
               args.kv_cache_dtype)


if __name__ == "__main__":
    main()
