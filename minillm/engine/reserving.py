"""A contiguous KV cache's memory use, on the paged pool: the baseline paging is measured against.

Before PagedAttention (Kwon et al. 2023, §3), a serving system gave each request one
contiguous region of the cache, as long as the longest it might grow: its prompt plus
``max_tokens``. The region is held from the request's first step to its last, whether or
not the tokens ever come (*reservation* waste), so the pool fits fewer requests at once.

:class:`ReservingBlockManager` reproduces that rule with the engine's own blocks: a
request's first reservation takes the blocks for ``prompt + max_tokens`` at once, and it
never needs another. The blocks need not be adjacent in the pool (contiguity itself costs
nothing here); what is measured is the memory held, and hence how many requests the same
pool can run together. Prefix caching is off: a contiguous cache has nothing to share.

    llm = LLM(model, block_manager=ReservingBlockManager(num_blocks=256, block_size=16))
"""

from __future__ import annotations

from .block_manager import BlockManager
from .sequence import Sequence


class ReservingBlockManager(BlockManager):
    """Blocks for ``prompt + max_tokens`` taken at a request's start, none after."""

    def __init__(self, num_blocks: int, block_size: int):
        super().__init__(num_blocks, block_size, prefix_caching=False)

    def reservation(self, seq: Sequence) -> int:
        """The blocks a request holds for its whole life."""
        return self.blocks_for(seq.num_prompt_tokens + seq.max_tokens)

    def new_blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        return max(self.reservation(seq) - len(seq.block_table),
                   super().new_blocks_needed(seq, num_new_tokens))

    def reserve(self, seq: Sequence, num_new_tokens: int) -> list[tuple[int, int]]:
        copies = super().reserve(seq, num_new_tokens)
        while len(seq.block_table) < self.reservation(seq):
            seq.block_table.append(self._new_block().id)
        return copies
