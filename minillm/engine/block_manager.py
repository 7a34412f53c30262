"""Paged KV-cache bookkeeping: a pool of fixed-size blocks, block tables, reference counts,
prefix caching and copy-on-write (Kwon et al. 2023, "PagedAttention", §4.2–4.4).

A contiguous cache reserves ``max_len`` slots per request up front and wastes whatever the
request does not use. A paged cache hands out blocks of ``block_size`` token slots as a
request grows; its **block table** maps the request's i-th block of tokens to a physical
block anywhere in the pool, so the only waste is the unfilled end of each last block.

Blocks can be shared, which is what a reference count is for:

* **prefix caching**: a full block is named by a hash chain, hash(parent's hash, its token
  ids), so a block means "these tokens after that prefix". A new request whose prompt starts
  with cached blocks reuses them (a hit compares the token ids and the parent as well, so a
  hash collision cannot hand out the wrong keys). Freed blocks stay cached until the pool
  needs them; the least recently freed goes first (LRU).
* **forks** (several samples of one prompt): the children share every block;
* **copy-on-write**: a block held by more than one table is never written; before a
  sequence writes into one, it gets a private copy (the caller copies the tensors).

Two rules keep prefix caching exact:

* the block that holds a sequence's last token is never taken from the cache: the step
  must compute at least that token, whose logits give the next output token;
* only blocks whose tokens are all computed (verified) are hashed and shared: a block
  holding speculative tokens may still change.

A model whose every layer attends to a sliding window of ``w`` tokens (Mistral) never
reads a key more than ``w`` positions behind the newest query again, so the scheduler gives
those blocks back as the sequence moves on (:meth:`BlockManager.release_behind_window`):
each leaves the block table as :data:`RELEASED`, keeping the table's indices (token t
stays in entry ``t // block_size``), and a sequence holds about ``w / block_size`` blocks
however long it grows. One global layer (Gemma 3) reads every key, so under one block
table nothing is released.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from .sequence import Sequence

RELEASED = -1  # a block-table entry given back: behind the window of every layer


def released_tokens(block_table: list[int], block_size: int) -> int:
    """How many leading tokens of a block table are in released blocks: nothing may be
    written there again."""
    released = next((i for i, b in enumerate(block_table) if b != RELEASED), len(block_table))
    return released * block_size


class OutOfBlocks(RuntimeError):
    """The pool has no free block left (the scheduler should have checked first)."""


@dataclass
class Block:
    id: int
    ref_count: int = 0
    hash: int | None = None  # set once the block is full of computed tokens
    parent_hash: int | None = None
    token_ids: tuple[int, ...] = ()


def chain_hash(parent_hash: int | None, token_ids: tuple[int, ...]) -> int:
    """The name of a full block: its tokens *after* the prefix named by ``parent_hash``."""
    return hash((parent_hash, token_ids))


class BlockManager:
    """Hands out the blocks of a pool of ``num_blocks`` x ``block_size`` token slots."""

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = True):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need at least one block of at least one slot, got {num_blocks} "
                             f"blocks of {block_size}")
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # free blocks, least recently freed first (the next to be evicted from the cache)
        self.free_blocks: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.cached: dict[int, int] = {}  # chain hash -> block id

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free(self) -> int:
        return len(self.free_blocks)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- prefix cache -------------------------------------------------------------------

    def prefix_hashes(self, tokens: list[int]) -> list[int]:
        """The chain hashes of the full blocks of ``tokens`` that a starting sequence may find
        in the cache: every full block except the one holding the last token (that token
        must be computed: its logits give the next token). A subclass may override this
        (chapter 12 plugs in the learner's version); :meth:`cached_prefix_blocks` still
        checks each hit's token ids and parent."""
        size, hashes, parent = self.block_size, [], None
        for i in range((len(tokens) - 1) // size):
            parent = chain_hash(parent, tuple(tokens[i * size:(i + 1) * size]))
            hashes.append(parent)
        return hashes

    def _lookup(self, parent: int | None, ids: tuple[int, ...], block_hash: int) -> Block | None:
        block = self.blocks[self.cached[block_hash]] if block_hash in self.cached else None
        if block is None or block.parent_hash != parent or block.token_ids != ids:
            return None  # a miss, or a hash collision
        return block

    def cached_prefix_blocks(self, seq: Sequence) -> list[Block]:
        """The cached blocks a starting sequence can reuse: the longest run of its full blocks
        of tokens (the prompt, and after a preemption the output so far) found in the cache,
        never the one holding its last token."""
        if not self.prefix_caching:
            return []
        hits, parent, tokens = [], None, seq.tokens
        for i, block_hash in enumerate(self.prefix_hashes(tokens)):
            ids = tuple(tokens[i * self.block_size:(i + 1) * self.block_size])
            block = self._lookup(parent, ids, block_hash)
            if block is None:
                break
            hits.append(block)
            parent = block_hash
        return hits

    # -- allocation ---------------------------------------------------------------------

    def _take(self, block: Block) -> None:
        if block.ref_count == 0:
            del self.free_blocks[block.id]
        block.ref_count += 1

    def _new_block(self) -> Block:
        """A free block with no content: the least recently freed, evicted from the cache."""
        if not self.free_blocks:
            raise OutOfBlocks("no free KV-cache block")
        block = self.blocks[next(iter(self.free_blocks))]
        if block.hash is not None and self.cached.get(block.hash) == block.id:
            del self.cached[block.hash]
        block.hash, block.parent_hash, block.token_ids = None, None, ()
        self._take(block)
        return block

    def start(self, seq: Sequence) -> int:
        """Give a waiting sequence its cached prefix blocks; returns how many tokens they hold
        (the sequence's ``num_computed`` starts there)."""
        if seq.block_table:
            raise ValueError(f"sequence {seq.id} already holds blocks")
        hits = self.cached_prefix_blocks(seq)
        for block in hits:
            self._take(block)
        seq.block_table = [block.id for block in hits]
        seq.num_computed = seq.cached_tokens = len(hits) * self.block_size
        return seq.num_computed

    def new_blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        """Blocks to take for ``num_new_tokens`` more computed tokens (copy-on-write
        included)."""
        end = seq.num_computed + num_new_tokens
        needed = max(self.blocks_for(end) - len(seq.block_table), 0)
        first_written = seq.num_computed // self.block_size
        if first_written < len(seq.block_table) and num_new_tokens > 0 \
                and self.blocks[seq.block_table[first_written]].ref_count > 1:
            needed += 1  # the shared block being written gets a private copy
        return needed

    def can_reserve(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.new_blocks_needed(seq, num_new_tokens) <= self.num_free

    def reserve(self, seq: Sequence, num_new_tokens: int) -> list[tuple[int, int]]:
        """Make room for ``num_new_tokens`` more tokens of ``seq``. Returns the copies the
        cache must make first, (source block, destination block): copy-on-write of a shared
        block the new tokens are written into."""
        if not self.can_reserve(seq, num_new_tokens):
            raise OutOfBlocks(f"sequence {seq.id} needs "
                              f"{self.new_blocks_needed(seq, num_new_tokens)} blocks, "
                              f"{self.num_free} are free")
        copies = []
        first_written = seq.num_computed // self.block_size
        if first_written < len(seq.block_table) and num_new_tokens > 0:
            shared = self.blocks[seq.block_table[first_written]]
            if shared.ref_count > 1:
                private = self._new_block()
                shared.ref_count -= 1
                seq.block_table[first_written] = private.id
                copies.append((shared.id, private.id))
        end = seq.num_computed + num_new_tokens
        while len(seq.block_table) < self.blocks_for(end):
            seq.block_table.append(self._new_block().id)
        return copies

    def written_blocks(self, seq: Sequence, num_new_tokens: int) -> list[int]:
        """The blocks the next ``num_new_tokens`` tokens of ``seq`` are written into."""
        first = seq.num_computed // self.block_size
        last = (seq.num_computed + num_new_tokens - 1) // self.block_size
        return seq.block_table[first:last + 1] if num_new_tokens > 0 else []

    def commit(self, seq: Sequence, verified_tokens: int | None = None) -> None:
        """Register ``seq``'s newly full blocks in the prefix cache. Only the first
        ``verified_tokens`` tokens count (default: all computed ones); speculative tokens
        that may still be rejected must be left out."""
        if not self.prefix_caching:
            return
        verified = seq.num_computed if verified_tokens is None else verified_tokens
        full = min(verified, seq.num_tokens) // self.block_size
        done = 0  # leading blocks already named (cache hits, sealed by earlier steps,
        # or released: those were sealed first)
        while done < full and (seq.block_table[done] == RELEASED
                               or self.blocks[seq.block_table[done]].hash is not None):
            done += 1
        tokens = seq.tokens
        parent = self._chain_hash_of(seq, done) if done < full else None
        for i in range(done, full):
            block = self.blocks[seq.block_table[i]]
            ids = tuple(tokens[i * self.block_size:(i + 1) * self.block_size])
            block.hash, block.parent_hash, block.token_ids = chain_hash(parent, ids), parent, ids
            self.cached.setdefault(block.hash, block.id)
            parent = block.hash

    def _chain_hash_of(self, seq: Sequence, count: int) -> int | None:
        """The chain hash naming ``seq``'s first ``count`` blocks (rehashed from its tokens
        when the last of them was released)."""
        if count == 0:
            return None
        if seq.block_table[count - 1] != RELEASED:
            return self.blocks[seq.block_table[count - 1]].hash
        parent, size = None, self.block_size
        for i in range(count):
            parent = chain_hash(parent, tuple(seq.tokens[i * size:(i + 1) * size]))
        return parent

    def blocks_behind_window(self, num_computed: int, window: int) -> int:
        """How many leading blocks of a sequence with ``num_computed`` tokens computed lie
        wholly before the first key its next query (at position ``num_computed``) sees."""
        first_seen = num_computed - window + 1
        return max(first_seen, 0) // self.block_size

    def release_behind_window(self, seq: Sequence, window: int) -> list[int]:
        """Give back the blocks of ``seq`` that no query can see again, every layer attending
        to the last ``window`` tokens (itself included): those whose every token lies
        ``window`` or more positions behind the next token to compute. Returns the ids of
        the blocks released.

        The sequence's table keeps :data:`RELEASED` in their place. A block shared with
        another sequence loses one holder; one nobody holds goes to the free list with its
        prefix-cache name (another prompt may still start from it). Only computed
        (verified) tokens count, so a rejected guess never brings a released key back in
        view."""
        behind = self.blocks_behind_window(seq.num_computed, window)
        released = []
        for i in reversed(range(min(behind, len(seq.block_table)))):
            block_id = seq.block_table[i]
            if block_id == RELEASED:
                break  # the ones before it went earlier
            self._drop(block_id)
            seq.block_table[i] = RELEASED
            released.append(block_id)
        return released[::-1]

    def _drop(self, block_id: int) -> None:
        """One holder fewer; a block nobody holds goes to the end of the free list."""
        block = self.blocks[block_id]
        block.ref_count -= 1
        if block.ref_count == 0:
            self.free_blocks[block_id] = None

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """``child`` shares every block of ``parent`` (copy-on-write on the first write)."""
        if child.block_table:
            raise ValueError(f"sequence {child.id} already holds blocks")
        for block_id in parent.block_table:
            if block_id != RELEASED:
                self.blocks[block_id].ref_count += 1
        child.block_table = list(parent.block_table)
        child.num_computed = parent.num_computed

    def free(self, seq: Sequence) -> None:
        """Release ``seq``'s blocks; a block nobody holds goes to the end of the free list,
        keeping its cached contents until the pool needs the block."""
        for block_id in reversed(seq.block_table):  # the prompt's first blocks are evicted last
            if block_id != RELEASED:
                self._drop(block_id)
        seq.block_table = []
