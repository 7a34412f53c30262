"""AWQ: activation-aware weight quantization (Lin et al., "AWQ", MLSys 2024).

**Salient weights are found through activations (§3.1).** Keeping just 1% of a layer's
*input channels* in full precision recovers most of what round-to-nearest loses, if the
channels are the ones whose *activations* are largest on average; picked by weight
magnitude or at random, they do almost nothing (the paper's Table 1). The product w·x of
a big input hits the output hard, whatever the size of w.

**Protect them by scaling, not by mixed precision (§3.2).** Quantization
Q(w) = Δ·Round(w/Δ) (eq. 1) errs by at most Δ/2 per weight. Multiply an input channel's
weights by s > 1 and divide its input by s:

    Q(w·s)·(x/s) = Δ'·Round(w·s/Δ')·x·(1/s)                                    (eq. 2)

The rounding error of Round(·) stays about the same, so that channel's output error is
scaled by (Δ'/Δ)·(1/s) (eq. 3): smaller, as long as the scaled channel does not become
its group's largest weight and stretch the step Δ' of everyone else. Which scales? The
ones that minimise the layer's output error on calibration inputs X (eq. 4),

    s* = argmin_s ‖Q(W·diag(s))·(diag(s)⁻¹·X) − W·X‖²,

searched in a one-parameter family (eq. 5): s = s_X^α, where s_X is the mean |x| of each
input channel over the calibration tokens and α ∈ [0, 1) runs over a grid; α = 0 is
plain round to nearest. As in the reference code, s is divided by √(max s · min s) so it
straddles 1, and the error is measured on the outputs of every linear layer sharing the
input (q/k/v after attn_norm, gate/up after mlp_norm), summed. The reference measures it
after the whole attention or MLP module; summing the linear outputs is cheaper on a CPU
and keeps the search a sum of matrix products.

**Folding keeps the float model unchanged.** 1/s is multiplied into the op that
produces X: the RMSNorm weight before q/k/v and gate/up, up_proj's output rows before
down_proj (the SwiGLU product is linear in up_proj's output), and v_proj's output rows
before o_proj. With grouped-query attention v_proj has fewer outputs than o_proj has
inputs: o_proj's input channel h·d + j carries value head ⌊h/g⌋'s channel j for the g
query heads of a group. The reference code skips o_proj then; we *tie* its scales
within each group (the activation statistic is averaged over the g heads), so one scale
per v_proj row folds exactly and o_proj is protected too.

**Clipping (the reference code's auto_clip).** After scaling, each weight group may be
clamped to ± r·max|w| for a ratio r from a grid (1, 0.95, ..., 0.55): outliers get
clipped, everything else gets a finer step. Each group keeps the ratio with the least
error in its share of the outputs, (x_g·(w_g − ŵ_g))² averaged over calibration tokens;
r = 1 (no clipping) is always a candidate, so the measured error never grows. That error
is d_gᵀ H_g d_g with H_g the group's block of the Gram matrix XᵀX/n, so we keep those
blocks and every calibration token counts. (The reference scores 512 sampled tokens; on
SmolLM2 at 3 bits, 128 sampled tokens made clipping overfit and *raise* the perplexity.)
With an asymmetric grid the bound ± r·max|w| clips only the side that reaches past it;
shrinking both ends, [r·min, r·max], did clearly worse. Like the reference we do not
clip q_proj and k_proj, whose errors reach the output through the softmax, not linearly.

:func:`quantize_model_awq` does all of this block by block (each block calibrated on the
outputs of the already quantized blocks before it) and stores :class:`QuantLinear` layers.
The pieces live one per module: the scale search in :mod:`.awq_search`, folding in
:mod:`.awq_fold`, clipping in :mod:`.awq_clip`; this module drives them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..linear import DEFAULT_SKIP, is_skipped
from ..model import Block, Transformer
from .awq_clip import clip_weight, group_errors, group_grams, scale_grams, search_clip
from .awq_fold import (
    fold_group,
    fold_into_linear,
    fold_into_norm,
    fold_into_values,
    tie_to_kv_heads,
)
from .awq_search import (
    InputStats,
    ScaleSearch,
    activation_magnitude,
    awq_scales,
    keep_channels,
    output_error,
    salient_channels,
    scaled_weight,
    search_scales,
)
from .basic import QuantScheme, quantize
from .calibration import BlockInputs, LayerReport, blocks_with_inputs, check_windows, linear_layers
from .qlinear import QuantLinear

__all__ = [  # the driver, and the pieces notebooks and tests reach as awq.<name>
    "InputStats", "activation_magnitude", "awq_scales", "clip_weight", "fold_into_linear",
    "fold_into_norm", "fold_into_values", "group_errors", "group_grams", "keep_channels",
    "output_error", "quantize_block_awq", "quantize_model_awq", "record_inputs",
    "salient_channels", "scale_grams", "scaled_weight", "search_clip", "search_scales",
    "tie_to_kv_heads",
]

# (op that produces the input, linear layers reading it): each group shares one scale vector
SCALE_GROUPS = (
    ("attn_norm", ("attn.q_proj", "attn.k_proj", "attn.v_proj")),
    ("attn.v_proj", ("attn.o_proj",)),
    ("mlp_norm", ("mlp.gate_proj", "mlp.up_proj")),
    ("mlp.up_proj", ("mlp.down_proj",)),
)
NOT_CLIPPED = ("attn.q_proj", "attn.k_proj")  # their error passes through the softmax


def record_inputs(block: Block, inputs: BlockInputs, max_tokens: int = 512, seed: int = 0,
                  scheme: QuantScheme | None = None) -> dict[str, InputStats]:
    """Run ``block`` on its calibration inputs once; for each group's shared input (keyed by
    the group's first linear: ``attn.q_proj``, ``attn.o_proj``, ``mlp.gate_proj``,
    ``mlp.down_proj``) keep mean |x| over all tokens, ``max_tokens`` random tokens and,
    given a ``scheme``, the Gram blocks of its groups (:class:`InputStats`)."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}")
    total = inputs.hidden.shape[0] * inputs.hidden.shape[1]
    keep = torch.zeros(total, dtype=torch.bool)
    keep[torch.randperm(total, generator=torch.Generator().manual_seed(seed))[:max_tokens]] = True
    stats = {names[0]: InputStats(scheme) for _, names in SCALE_GROUPS}
    seen = dict.fromkeys(stats, 0)

    def on_input(name: str, x: torch.Tensor) -> None:
        if name in stats:
            start, seen[name] = seen[name], seen[name] + x.shape[0]
            stats[name].add(x, keep[start:seen[name]])

    inputs.capture(block, on_input)
    return stats


@torch.no_grad()
def quantize_block_awq(block: Block, stats: dict[str, InputStats], scheme: QuantScheme,
                       grid: int = 20, clip: bool = True, skip: Sequence[str] = ()
                       ) -> dict[str, ScaleSearch]:
    """AWQ one block in place: search every group's scales on the float block, fold them,
    search clipping ranges on the scaled inputs, then store :class:`QuantLinear` layers
    (except the layers named in ``skip``, which keep their folded float weights).
    Returns the scale searches, keyed by each group's first linear."""
    searches, grams = {}, {}
    for previous, names in SCALE_GROUPS:
        mean_abs = stats[names[0]].mean_abs
        if previous == "attn.v_proj":
            mean_abs = tie_to_kv_heads(mean_abs, block.attn.num_heads, block.attn.num_kv_heads)
        weights = [block.get_submodule(name).weight for name in names]
        searches[names[0]] = search_scales(weights, stats[names[0]].sample, scheme, grid,
                                           mean_abs)
    for previous, names in SCALE_GROUPS:  # fold only now: every search saw the float block
        scales = searches[names[0]].scales
        fold_group(block, previous, names, scales)
        if clip:
            grams.update(dict.fromkeys(names, scale_grams(stats[names[0]].grams, scales)))
    for name, linear in linear_layers(block).items():
        if name in skip:
            continue
        weight = linear.weight.detach()
        if clip and name not in NOT_CLIPPED:
            weight = clip_weight(weight, search_clip(weight, grams[name], scheme, grid).ratios,
                                 scheme)
        block.set_submodule(name, QuantLinear(quantize(weight, scheme), linear.bias))
    return searches


def quantize_model_awq(model: Transformer, scheme: QuantScheme, *, windows: torch.Tensor,
                       skip: tuple[str, ...] = DEFAULT_SKIP, grid: int = 20, clip: bool = True,
                       batch_size: int = 8, progress: bool = True, max_tokens: int = 512,
                       report: dict[str, LayerReport] | None = None) -> Transformer:
    """AWQ-quantize every linear layer of the model's blocks, in place.

    windows: calibration tokens [num_windows, window] (``calibration_windows``).
    skip: layers whose name (``"layers.3.mlp.up_proj"``) contains one of these stay float
        (their inputs are still scaled and folded, exactly).
    grid: α candidates for the scale search (and ratios for clipping: 1 - i/grid).
    max_tokens: tokens per block input on which output errors are measured (the
        activation statistic s_X uses all tokens).
    report: a dict to receive each layer's :class:`LayerReport` (with its group's α),
        keyed like ``"layers.3.attn.q_proj"``.
    """
    check_windows(windows)
    for index, block, inputs in blocks_with_inputs(model, windows, batch_size, progress,
                                                   desc="AWQ"):
        stats = record_inputs(block, inputs, max_tokens, seed=index,
                              scheme=scheme if clip else None)
        skipped = [name for name in linear_layers(block)
                   if is_skipped(f"layers.{index}.{name}", skip)]
        searches = quantize_block_awq(block, stats, scheme, grid, clip, skipped)
        if report is not None:
            report.update({f"layers.{index}.{name}": searches[names[0]].report(i)
                           for _, names in SCALE_GROUPS for i, name in enumerate(names)})
    return model
