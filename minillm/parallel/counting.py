"""Count the collectives a process issues, whoever calls them.

The library's parallel layers count their own calls (:data:`.layers.COLLECTIVES`); a
learner's layers (chapter 14's lab) call ``torch.distributed`` directly, and a check of
"two all-reduces per block" must see those too without trusting the code it checks. Every
``torch.distributed`` collective is an operator of the ``c10d`` namespace, and operators
pass through PyTorch's dispatcher, which lets a *dispatch mode* see each call on this
thread (the same mechanism ``torch.compile`` uses to trace collectives):

    with CollectiveCounter() as counted:
        model(token_ids)
    counted.counts   # Counter({"all_reduce": 61, "all_gather": 1})

Only the thread that entered the mode is watched, and every operator it runs goes through
Python while it is on: count a few steps, never time them.
"""

from __future__ import annotations

from collections import Counter

# Entering any dispatch mode imports torch._dynamo (seconds): import it with this module, so
# that ranks forked from a process that counts inherit it instead of each paying again.
import torch._dynamo  # noqa: F401
from torch.utils._python_dispatch import TorchDispatchMode

# c10d operator names (the gloo, nccl and mpi backends share them) -> the collective
KINDS = {"allreduce_": "all_reduce", "allgather_": "all_gather",
         "_allgather_base_": "all_gather", "allgather_into_tensor_coalesced_": "all_gather",
         "reduce_scatter_": "reduce_scatter", "_reduce_scatter_base_": "reduce_scatter",
         "broadcast_": "broadcast", "alltoall_": "all_to_all", "alltoall_base_": "all_to_all"}


class CollectiveCounter(TorchDispatchMode):
    """While entered, ``counts[kind]`` grows by one for every collective this thread issues
    (kinds: all_reduce, all_gather, reduce_scatter, broadcast, all_to_all, or the
    operator's own name for any other)."""

    def __init__(self):
        super().__init__()
        self.counts: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "c10d":
            name = func.__name__.split(".")[0]
            self.counts[KINDS.get(name, name)] += 1
        return func(*args, **(kwargs or {}))
