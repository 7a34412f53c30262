# Generated from solutions/ch12_paged_kv_cache.py by `python -m minillm.grading.exercises`.
# Fill in the parts that raise NotImplementedError; do not edit the rest.
"""Chapter 12: the paged KV cache. Warm-ups: reference-counted blocks, copy-on-write, prefix
caching by hash chain, the slot mapping that tells attention where every key and value lives.
The lab, attention that reads keys and values through the block tables with no gathered copy,
is ``ch12_paged_attention.py``."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from minillm.engine.block_manager import OutOfBlocks, chain_hash


@dataclass
class BlockPool:
    """The bookkeeping of a pool of KV blocks (given).

    ``ref_counts[b]``: how many block tables hold block ``b``. ``free``: the blocks nobody
    holds, least recently freed first (an ordered dict used as an ordered set: its keys are
    the block ids). A free block may still hold a cached prefix, so the pool hands out the
    least recently freed block first and a freed block joins the end (PagedAttention §4.2,
    with the LRU eviction of vLLM's prefix cache).
    """

    ref_counts: list[int]
    free: OrderedDict[int, None]

    @classmethod
    def with_blocks(cls, num_blocks: int) -> BlockPool:
        return cls([0] * num_blocks, OrderedDict.fromkeys(range(num_blocks)))


def allocate(pool: BlockPool) -> int:
    """Exercise 12.1: Warm-up: hand out a fresh block, the least recently freed one.

    Take the first block of ``pool.free``, remove it from the free list, give it a ref
    count of 1 and return its id. With no free block left, raise ``OutOfBlocks`` (imported
    above) and change nothing.
    Hint: ``next(iter(pool.free))`` is the first key; ``del pool.free[block]`` removes it.
    """
    raise NotImplementedError("Exercise 12.1: Warm-up: hand out a fresh block, the least recently freed one")


def share(pool: BlockPool, block: int) -> None:
    """Exercise 12.1: Warm-up: one more block table holds ``block`` (a fork, a cache hit).

    Its ref count goes up by one. A block that nobody held (a cached block waiting on the
    free list) is in use again: it must leave the free list, or it could be handed out
    twice.
    """
    raise NotImplementedError("Exercise 12.1: Warm-up: one more block table holds ``block`` (a fork, a cache hit)")


def release(pool: BlockPool, block: int) -> None:
    """Exercise 12.1: Warm-up: one block table lets go of ``block``.

    Its ref count goes down by one; when nobody holds it any more it joins the END of the
    free list (the most recently freed block is evicted last, so a popular prefix stays
    cached longest). Releasing a block that is already free is a bug: raise ValueError.
    """
    raise NotImplementedError("Exercise 12.1: Warm-up: one block table lets go of ``block``")


def copy_on_write(pool: BlockPool, table: list[int], index: int) -> tuple[int, int] | None:
    """Exercise 12.2: Warm-up: make ``table[index]`` safe to write into (copy-on-write, §4.4).

    A block that only this table holds is written in place: return None. A shared block
    (ref count > 1) is never written: allocate a private block, let go of the shared one,
    put the private one in the table and return ``(shared, private)``; the cache then
    copies the shared block's keys and values into the private block before the write.
    If the pool is empty, ``allocate`` raises and nothing may have changed yet.
    """
    raise NotImplementedError("Exercise 12.2: Warm-up: make ``table[index]`` safe to write into (copy-on-write, §4.4)")


def prefix_hashes(tokens: list[int], block_size: int) -> list[int]:
    """Exercise 12.3: Warm-up: the hash chain naming the full blocks a request may find cached.

    Block i holds ``tokens[i * block_size:(i + 1) * block_size]``. Its name is
    ``chain_hash(name of block i - 1 (None for block 0), tuple of its token ids)``, so a
    name means "these tokens after exactly that prefix". Name every full block EXCEPT the
    one holding the last token: that token must be computed (its logits give the first
    output token), so its block is never taken from the cache. Returns the names, block 0
    first.
    """
    raise NotImplementedError("Exercise 12.3: Warm-up: the hash chain naming the full blocks a request may find cached")


def slot_mapping(block_table: list[int], start: int, count: int, block_size: int) -> list[int]:
    """Exercise 12.4: Warm-up: the pool slots of tokens ``start .. start + count - 1``.

    Token t lives in block ``block_table[t // block_size]`` at offset ``t % block_size``.
    Seen as one long row of slots, that is slot ``block * block_size + offset`` of the
    pool: where the engine writes the token's key and value in every layer.
    """
    raise NotImplementedError("Exercise 12.4: Warm-up: the pool slots of tokens ``start .. start + count - 1``")

