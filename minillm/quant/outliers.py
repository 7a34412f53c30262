"""Outlier features: the few hidden dimensions where activations are huge.

LLM.int8() (Dettmers et al. 2022, §4) found that the inputs of a transformer's linear
layers hold a handful of feature dimensions with magnitudes of 6 to 60+ while the rest
stay near 1, and that they sit *in the same dimensions* in most layers. One such value
in a token's row sets that row's absmax scale, so int8 rounds every other value of the
row coarsely: this is why per-token activation quantization breaks and why LLM.int8()
multiplies those dimensions in high precision.

:func:`activation_stats` runs calibration windows through the model and records, for
every linear layer's input channel, the largest |x| and how many tokens reach the
threshold; :func:`outlier_features` counts, for each hidden dimension, in how many layer
inputs it is an outlier.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .calibration import blocks_with_inputs


@dataclass
class ActivationStats:
    """Per input channel of every linear layer (name like ``"layers.3.attn.q_proj"``)."""

    max_abs: dict[str, torch.Tensor]  # [in_features]: largest |x| over all tokens
    count_over: dict[str, torch.Tensor]  # [in_features]: tokens with |x| >= threshold
    num_tokens: int
    threshold: float

    def layer_names(self, kind: str) -> list[str]:
        """Names of one kind of layer (``"attn.q_proj"``, ``"mlp.down_proj"``) in order."""
        return [name for name in self.max_abs if name.endswith(f".{kind}")]

    def max_abs_matrix(self, kind: str) -> torch.Tensor:
        """[layers, in_features]: max |x| per input channel of each layer of ``kind``."""
        return torch.stack([self.max_abs[name] for name in self.layer_names(kind)])


@dataclass
class OutlierFeatures:
    """Which hidden dimensions exceed the threshold, and in how many layer inputs."""

    dims: torch.Tensor  # hidden dimensions that are outliers somewhere, most layers first
    layer_counts: torch.Tensor  # [hidden]: layer inputs where each dimension reaches it
    token_fraction: torch.Tensor  # [hidden]: fraction of tokens over it, all inputs pooled
    num_inputs: int  # layer inputs examined


@torch.inference_mode()
def activation_stats(model, windows: torch.Tensor, threshold: float = 6.0,
                     batch_size: int = 8, progress: bool = True) -> ActivationStats:
    """Record max |x| and threshold crossings per input channel of every linear layer while
    ``windows`` [n, seq] of tokens run through ``model`` (block by block)."""
    if threshold <= 0:
        raise ValueError(f"threshold must be positive, got {threshold}")
    max_abs: dict[str, torch.Tensor] = {}
    count_over: dict[str, torch.Tensor] = {}

    def record(prefix):
        def on_input(name, x):
            full = f"{prefix}.{name}"
            magnitude = x.abs().float()
            current = magnitude.amax(dim=0)
            over = (magnitude >= threshold).sum(dim=0)
            if full in max_abs:  # the same layer seen again (another batch of windows)
                current = torch.maximum(max_abs[full], current)
                over = over + count_over[full]
            max_abs[full], count_over[full] = current, over
        return on_input

    for index, block, inputs in blocks_with_inputs(model, windows, batch_size, progress,
                                                   desc="activation stats"):
        inputs.capture(block, record(f"layers.{index}"))
    return ActivationStats(max_abs, count_over, windows.numel(), threshold)


def outlier_features(stats: ActivationStats,
                     kinds: tuple[str, ...] = ("attn.q_proj", "mlp.gate_proj")
                     ) -> OutlierFeatures:
    """Outlier dimensions of the hidden state, from the inputs of the layers in ``kinds``
    (by default the attention and the MLP input of every block, both ``hidden_size`` wide).
    """
    names = [name for kind in kinds for name in stats.layer_names(kind)]
    if not names:
        raise ValueError(f"no layers of kinds {kinds} in the statistics; "
                         f"names look like {next(iter(stats.max_abs), '(none)')!r}")
    widths = {stats.max_abs[name].numel() for name in names}
    if len(widths) != 1:
        raise ValueError(f"layers of kinds {kinds} have inputs of different widths {widths}; "
                         "choose layers that read the same hidden state")
    over = torch.stack([stats.max_abs[name] >= stats.threshold for name in names])
    layer_counts = over.sum(dim=0)
    tokens_over = torch.stack([stats.count_over[name] for name in names]).sum(dim=0)
    token_fraction = tokens_over.double() / (stats.num_tokens * len(names))
    dims = torch.nonzero(layer_counts).flatten()
    dims = dims[torch.argsort(layer_counts[dims], descending=True, stable=True)]
    return OutlierFeatures(dims, layer_counts, token_fraction.float(), len(names))


@torch.inference_mode()
def layer_inputs(model, tokens: torch.Tensor, name: str) -> torch.Tensor:
    """The input [tokens, in_features] that the layer called ``name`` (like
    ``"layers.11.mlp.down_proj"``) receives while ``model`` reads ``tokens`` [batch, seq]."""
    modules = dict(model.named_modules())
    if name not in modules:
        raise ValueError(f"the model has no layer {name!r}; names look like "
                         "'layers.0.attn.q_proj' or 'layers.0.mlp.down_proj'")
    seen = []
    handle = modules[name].register_forward_pre_hook(
        lambda module, args: seen.append(args[0].reshape(-1, args[0].shape[-1])))
    try:
        model(tokens)
    finally:
        handle.remove()
    return torch.cat(seen)
