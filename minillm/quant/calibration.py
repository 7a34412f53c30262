"""Calibration: real text through the model, one transformer block at a time.

GPTQ and AWQ do not look at weights alone: they choose the quantized weight that keeps a
layer's *outputs* close on real inputs X (``||WX - ŴX||²``). Both proceed block by block:

1. run calibration text through the embedding: the inputs of block 0;
2. for each block: record what its linear layers see (forward pre-hooks), quantize them,
   then run the *quantized* block to produce the next block's inputs, so every block is
   calibrated on the inputs it will really get, errors of earlier blocks included.

:func:`calibration_windows` cuts fixed windows of tokens from a corpus's train split;
:func:`blocks_with_inputs` walks the blocks and hands each one's inputs to the caller.
Only one block's activations live in memory at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn
from tqdm.auto import tqdm

from ..data import load_documents
from ..model import Block, Transformer


def calibration_windows(tokenizer, num_windows: int = 128, window: int = 512,
                        corpus: str = "sotu", seed: int = 0, split: str = "train"
                        ) -> torch.Tensor:
    """``num_windows`` windows of ``window`` tokens from random places in ``corpus``'s
    ``split``, as a LongTensor [num_windows, window]. Fixed by ``seed``. Calibration and
    training take the train split; "eval" is for held-out measurements."""
    documents = load_documents(corpus, split)
    order = torch.randperm(len(documents), generator=torch.Generator().manual_seed(seed))
    tokens: list[int] = []
    needed = 4 * num_windows * window  # enough text for windows that rarely overlap
    for i in order.tolist():
        tokens.extend(tokenizer.encode(documents[i]))
        if len(tokens) >= needed:
            break
    if len(tokens) < window + 1:
        raise ValueError(f"corpus {corpus!r} has fewer than {window + 1} tokens")
    stream = torch.tensor(tokens)
    generator = torch.Generator().manual_seed(seed + 1)
    starts = torch.randint(0, len(stream) - window, (num_windows,), generator=generator)
    return torch.stack([stream[s:s + window] for s in starts.tolist()])


def check_windows(windows: torch.Tensor) -> None:
    """Calibration inputs must be a non-empty LongTensor [num_windows, seq] of token ids."""
    if not isinstance(windows, torch.Tensor) or windows.ndim != 2 \
            or windows.dtype != torch.long or windows.numel() == 0:
        raise ValueError("windows must be a non-empty LongTensor [num_windows, seq] of token "
                         "ids, e.g. calibration_windows(tokenizer, 16, 512) from "
                         "minillm.quant.calibration")


@dataclass
class BlockInputs:
    """The hidden states entering one block for every calibration window, and how to run it."""

    hidden: torch.Tensor  # [windows, seq, hidden_size]
    rope_cos: torch.Tensor
    rope_sin: torch.Tensor
    mask: torch.Tensor | None  # None for one-token windows: nothing to hide
    batch_size: int = 8

    @torch.inference_mode()
    def run(self, block: Block) -> torch.Tensor:
        """The block's outputs for all windows (computed ``batch_size`` windows at a time)."""
        return torch.cat([block(chunk, self.rope_cos, self.rope_sin, self.mask)
                          for chunk in self.hidden.split(self.batch_size)])

    def capture(self, block: Block, on_input: Callable[[str, torch.Tensor], None]) -> None:
        """Run ``block`` and call ``on_input(name, x)`` with each linear layer's input,
        flattened to [tokens, in_features]; ``name`` is relative to the block
        (``"attn.q_proj"``, ``"mlp.down_proj"``)."""
        def hook_for(name):
            return lambda module, args: on_input(name, args[0].reshape(-1, args[0].shape[-1]))

        handles = [module.register_forward_pre_hook(hook_for(name))
                   for name, module in linear_layers(block).items()]
        try:
            self.run(block)
        finally:
            for handle in handles:
                handle.remove()


@dataclass(frozen=True)
class LayerReport:
    """How well one layer was quantized, judged on calibration inputs: the mean squared
    output error ||Wx - Ŵx||² with the method, and with plain round to nearest.

    GPTQ and AWQ both fill a ``report`` dict with these, keyed like ``"layers.3.mlp.up_proj"``.
    For AWQ the error is the scale search's (before clipping), and ``alpha`` is the scale
    exponent chosen for the layer's input group; other methods leave it ``None``.
    """

    error: float
    rtn_error: float
    alpha: float | None = None


def linear_layers(module: nn.Module) -> dict[str, nn.Module]:
    """The ``nn.Linear`` layers inside ``module``, by name, in definition order."""
    return {name: m for name, m in module.named_modules() if isinstance(m, nn.Linear)}


@torch.inference_mode()
def blocks_with_inputs(model: Transformer, windows: torch.Tensor, batch_size: int = 8,
                       progress: bool = True, desc: str = "blocks"
                       ) -> Iterator[tuple[int, Block, BlockInputs]]:
    """Yield ``(index, block, inputs)`` for each block in order.

    The caller may change the block (quantize it) before asking for the next one: the next
    block's inputs are then computed by the changed block.
    """
    kinds = model.layer_inputs(windows.shape[1], windows.device)
    hidden = torch.cat([model.embed(chunk) for chunk in windows.split(batch_size)])
    for index, block in enumerate(tqdm(model.layers, desc=desc, disable=not progress)):
        inputs = BlockInputs(hidden, *kinds[block.kind], batch_size)
        yield index, block, inputs
        hidden = inputs.run(block)
