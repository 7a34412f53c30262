"""Chapter 08: AWQ — activation-aware weight quantization (Lin et al. 2024)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


def activation_magnitude(batches: Sequence[torch.Tensor]) -> torch.Tensor:
    """Exercise 08.1: Return the mean |x| of each input channel over every token of every batch.

    batches: tensors shaped [..., in] (e.g. [batch, seq, in] or [tokens, in]), possibly of
    different sizes. Returns [in]: s_X of the AWQ paper (eq. 5), the average magnitude of
    each channel over *all* tokens, so a batch of 7 tokens weighs 7 times one of 1.
    Hint: flatten each batch to [tokens, in]; sum |x| over tokens and count the tokens.
    """
    ### BEGIN SOLUTION
    flat = [b.reshape(-1, b.shape[-1]) for b in batches]
    return sum(f.abs().sum(dim=0) for f in flat) / sum(f.shape[0] for f in flat)
    ### END SOLUTION


def search_scales(weight: torch.Tensor, x: torch.Tensor,
                  quantize_fn: Callable[[torch.Tensor], torch.Tensor],
                  grid: int = 20) -> tuple[torch.Tensor, float]:
    """Exercise 08.2: Grid-search AWQ's per-channel scales s = s_X^alpha for one linear layer.

    weight: [out, in]; x: calibration inputs [tokens, in]; quantize_fn(w) returns the
    quantized-then-dequantized weight (round to nearest). For alpha = i / grid,
    i = 0, ..., grid - 1:
      1. s = s_X ** alpha with s_X the mean |x| per channel; floor s at 1e-4, then divide it
         by sqrt(s.max() * s.min()) (the reference code's normalisation);
      2. the layer's effective weight is quantize_fn(weight * s) / s (eq. 4: scale the
         weight columns up, the inputs down);
      3. its error is the squared output difference summed over tokens and outputs,
         ||x W^T - x W_eff^T||^2.
    Return (s, alpha) of the smallest error (the first one if several tie).
    Hint: alpha = 0 gives s = 1: plain round to nearest is always a candidate.
    """
    ### BEGIN SOLUTION
    mean_abs = x.abs().mean(dim=0)
    best = None
    for i in range(grid):
        alpha = i / grid
        s = mean_abs.pow(alpha).clamp(min=1e-4)
        s = s / (s.max() * s.min()).sqrt()
        effective = quantize_fn(weight * s) / s
        error = (x @ (weight - effective).T).pow(2).sum().item()
        if best is None or error < best[0]:
            best = (error, s, alpha)
    return best[1], best[2]
    ### END SOLUTION


def fold_scales(norm_weight: torch.Tensor, weights: Sequence[torch.Tensor],
                scales: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Exercise 08.3: Fold per-channel scales into an RMSNorm weight and the linears after it.

    The block computes linear_k(RMSNorm(x)) = (rms-normalised x * norm_weight) @ W_k^T for
    each W_k in ``weights`` ([out_k, in]). Return (new_norm_weight, new_weights) such that
    the linears' input columns are multiplied by ``scales`` [in] (what AWQ quantizes) and
    every output is unchanged. Return new tensors; leave the arguments as they are.
    Hint: (W diag(s)) (x / s) = W x.
    """
    ### BEGIN SOLUTION
    return norm_weight / scales, [w * scales for w in weights]
    ### END SOLUTION
