# Generated from solutions/ch18_window.py by `python -m minillm.grading.exercises`.
# Fill in the parts that raise NotImplementedError; do not edit the rest.
"""Chapter 18 lab: the sliding-window block release. A model whose every layer attends to
the last ``window`` tokens never reads older keys again, so the engine gives their blocks
back as each sequence moves on, and a request may grow past the pool. The library's version
is :meth:`minillm.engine.block_manager.BlockManager.release_behind_window`; the graded tests
compare yours with it, step by step, on twin block managers, then run it in the engine."""

from __future__ import annotations

from minillm.engine.block_manager import RELEASED, BlockManager
from minillm.engine.sequence import Sequence


def release_behind_window(manager: BlockManager, seq: Sequence, window: int) -> list[int]:
    """Exercise 18.6: Lab: give back the blocks of ``seq`` that no query will read again.

    Who calls it: the engine's scheduler, after every step that moved ``seq``'s computed
    tokens on (and when ``seq`` starts from cached prefix blocks), for a model whose every
    layer sees only the last ``window`` tokens, the query's own included: the query at
    position p reads keys at positions p - window + 1 .. p.

    * ``manager``: the engine's :class:`~minillm.engine.block_manager.BlockManager`. Read
      and change ``manager.blocks[i].ref_count`` (how many block tables hold block i),
      ``manager.free_blocks`` (an ``OrderedDict`` of the free block ids, the next to be
      reused first) and ``manager.block_size``; nothing else.
    * ``seq.num_computed``: its tokens 0 .. num_computed - 1 have keys and values in the
      cache; the next query is at position ``num_computed`` (later steps' queries are later
      still; a rejected speculative guess never counts as computed).
    * ``seq.block_table[i]``: the block holding its tokens i·block_size .. (i+1)·block_size - 1,
      or ``RELEASED`` (-1) for one given back earlier.
    * ``window`` >= 1.

    Returns the ids of the blocks released by this call, in block-table order. Afterwards:

    * every block wholly before the next query's first visible key is ``RELEASED`` in the
      table (the table keeps its length: token t stays in entry t // block_size); every
      block holding a key some future query can see is untouched;
    * each released block lost exactly one holder; one that nobody holds any more joins
      the END of ``manager.free_blocks`` (reused last), keeping its prefix-cache name and
      contents (``hash``, ``parent_hash``, ``token_ids``): another prompt may start from it;
      one still held by another sequence (a fork) stays out of the free list. Blocks freed
      by one call join latest first, the earliest at the very end (as ``manager.free``
      does: a prefix-cache hit needs a prompt's first blocks most);
    * a second call with nothing new computed releases nothing.

    Hint: chapter 18, section 5; vLLM's ``SlidingWindowManager``
    (``vllm/v1/core/single_type_kv_cache_manager.py``) does this for its KV-cache groups.
    """
    raise NotImplementedError("Exercise 18.6: Lab: give back the blocks of ``seq`` that no query will read again")
