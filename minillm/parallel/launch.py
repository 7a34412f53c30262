"""Run a function on ``world`` processes joined in a torch.distributed process group.

``run_ranks(fn, world, *args)`` spawns the processes (``torch.multiprocessing``, spawn
start method: ``fn`` must be a module-level function; ``start_method="fork"`` starts them
in a fraction of a second, each a copy of the caller with everything it has loaded, for a
caller that holds no process group of its own), joins them in a gloo group over
127.0.0.1 (nccl on GPUs is the same call with ``backend="nccl"``), calls
``fn(rank, world, *args)`` on each and returns every rank's result, in rank order. A rank
that raises takes the others down with it (torch's process context terminates them), and
a group that has not finished after ``timeout`` seconds is killed: no orphan ranks, no
hang. For several machines, ``torchrun --nnodes`` starts the processes instead.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    """A TCP port nobody listens on right now, for the group's rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Starting a group is slow on a busy machine (each rank imports torch, loads its shard,
# may build kernels): joining gets this budget, whatever the collectives' own timeout.
STARTUP_TIMEOUT = timedelta(minutes=2)


def under_torchrun() -> bool:
    """Was this process started by torchrun (or another env:// launcher)?"""
    return all(name in os.environ for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR",
                                                "MASTER_PORT"))


def join_group_at(store: str, rank: int, world: int) -> dist.Store:
    """Join the gloo group whose store rank 0 hosts at ``host:port`` (within
    :data:`STARTUP_TIMEOUT`); returns the store."""
    host, port = store.rsplit(":", 1)
    meeting = dist.TCPStore(host, int(port), world, is_master=rank == 0,
                            wait_for_workers=False, timeout=STARTUP_TIMEOUT)
    dist.init_process_group("gloo", store=meeting, rank=rank, world_size=world,
                            timeout=STARTUP_TIMEOUT)
    return meeting


def join_torchrun_group(world: int) -> None:
    """Join torchrun's group (env:// rendezvous, within :data:`STARTUP_TIMEOUT`), checking it
    has ``world`` ranks."""
    if int(os.environ["WORLD_SIZE"]) != world:
        raise ValueError(f"torchrun started {os.environ['WORLD_SIZE']} processes but the "
                         f"engine asks for tensor_parallel_size={world}; make them equal")
    dist.init_process_group("gloo", init_method="env://", timeout=STARTUP_TIMEOUT)


def set_collective_timeout(seconds: float) -> None:
    """From now on, every collective of the default group fails after ``seconds`` (once
    the group has started: a lost rank must be noticed in seconds, not minutes). torch has
    no public setter for a live group; this is the one its own elastic agents use."""
    dist.distributed_c10d._set_pg_timeout(timedelta(seconds=seconds))


def share_cores(world: int) -> None:
    """Give this rank its share of this machine's cores: ``world`` processes (or, under
    torchrun, the ``LOCAL_WORLD_SIZE`` on this machine) each running all cores' threads
    would fight over them."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // local))


def _rank_main(rank: int, fn, world: int, port: int, out: str, backend: str, args) -> None:
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=60))
    try:
        share_cores(world)
        torch.save(fn(rank, world, *args), Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def run_ranks(fn, world: int, *args, timeout: float = 300.0, backend: str = "gloo",
              start_method: str = "spawn") -> list:
    """``[fn(rank, world, *args) for rank in range(world)]``, each on its own process."""
    if world < 1:
        raise ValueError(f"world size must be at least 1, got {world}")
    with tempfile.TemporaryDirectory() as out:
        context = mp.start_processes(_rank_main, nprocs=world, join=False,
                                     start_method=start_method,
                                     args=(fn, world, free_port(), out, backend, args))
        deadline = time.monotonic() + timeout
        while not context.join(timeout=1.0):
            if time.monotonic() > deadline:
                for process in context.processes:
                    process.kill()
                raise TimeoutError(f"{world} ranks did not finish within {timeout} s; "
                                   "killed them")
        return [torch.load(Path(out) / f"rank{rank}.pt", weights_only=False)
                for rank in range(world)]
