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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from ..linear import DEFAULT_SKIP, is_skipped
from ..model import Attention, Block, RMSNorm, Transformer
from .basic import QuantScheme, _grouped, _ungrouped, fake_quantize, quantize
from .calibration import BlockInputs, LayerReport, blocks_with_inputs, check_windows, linear_layers
from .qlinear import QuantLinear

# (op that produces the input, linear layers reading it): each group shares one scale vector
SCALE_GROUPS = (
    ("attn_norm", ("attn.q_proj", "attn.k_proj", "attn.v_proj")),
    ("attn.v_proj", ("attn.o_proj",)),
    ("mlp_norm", ("mlp.gate_proj", "mlp.up_proj")),
    ("mlp.up_proj", ("mlp.down_proj",)),
)
NOT_CLIPPED = ("attn.q_proj", "attn.k_proj")  # their error passes through the softmax


def activation_magnitude(x: torch.Tensor) -> torch.Tensor:
    """s_X of eq. 5: the mean |x| of each input channel over all tokens of ``x`` [..., in]."""
    return x.reshape(-1, x.shape[-1]).abs().mean(dim=0)


@dataclass
class InputStats:
    """What AWQ keeps of one linear layer's calibration inputs, fed chunk by chunk:
    the mean |x| per channel over *all* tokens, a sample of tokens to score the scale search
    on, and, when a ``scheme`` is given, the per-group Gram blocks of all tokens (for
    clipping, :func:`group_grams`)."""

    scheme: QuantScheme | None = None
    abs_sum: torch.Tensor | None = None
    gram_sum: torch.Tensor | None = None
    num_tokens: int = 0
    samples: list[torch.Tensor] = field(default_factory=list)

    def add(self, x: torch.Tensor, keep: torch.Tensor | None = None) -> None:
        """Account for a chunk ``x`` [tokens, in]; ``keep`` (bool [tokens]) marks sampled ones."""
        x = x.reshape(-1, x.shape[-1]).float()
        self.abs_sum = _accumulate(self.abs_sum, x.abs().sum(dim=0))
        if self.scheme is not None:
            self.gram_sum = _accumulate(self.gram_sum, group_grams(x, self.scheme) * len(x))
        self.num_tokens += x.shape[0]
        if keep is not None:
            self.samples.append(x[keep])

    @property
    def mean_abs(self) -> torch.Tensor:
        if not self.num_tokens:
            raise ValueError("no inputs recorded yet: call add() with some tokens first")
        return self.abs_sum / self.num_tokens

    @property
    def grams(self) -> torch.Tensor:
        if self.gram_sum is None:
            raise ValueError("no Gram blocks: create InputStats(scheme=...) and add() tokens")
        return self.gram_sum / self.num_tokens

    @property
    def sample(self) -> torch.Tensor:
        if not self.samples:
            raise ValueError("no tokens sampled: pass keep= to add(), or use a larger max_tokens")
        return torch.cat(self.samples)


def _accumulate(total: torch.Tensor | None, value: torch.Tensor) -> torch.Tensor:
    return value if total is None else total + value


def output_error(weight: torch.Tensor, approx: torch.Tensor, x: torch.Tensor) -> float:
    """Mean over tokens of ‖x Wᵀ − x Ŵᵀ‖²: how far the layer's outputs move."""
    return (x @ (weight - approx).T).pow(2).sum().item() / x.shape[0]


def salient_channels(weight: torch.Tensor, x: torch.Tensor, fraction: float = 0.01,
                     by: str = "activation", seed: int = 0) -> torch.Tensor:
    """Indices of the ``fraction`` of input channels to protect (paper §3.1, Table 1):
    largest mean |x| (``by="activation"``), largest weight-column norm (``"weight"``), or
    ``"random"``."""
    count = max(1, round(fraction * weight.shape[1]))
    if by == "activation":
        return activation_magnitude(x).topk(count).indices
    if by == "weight":
        return weight.norm(dim=0).topk(count).indices
    if by == "random":
        generator = torch.Generator().manual_seed(seed)
        return torch.randperm(weight.shape[1], generator=generator)[:count]
    raise ValueError(f"by must be 'activation', 'weight' or 'random', got {by!r}")


def keep_channels(weight: torch.Tensor, approx: torch.Tensor,
                  channels: torch.Tensor) -> torch.Tensor:
    """``approx`` with the input ``channels`` (columns) put back to full precision."""
    kept = approx.clone()
    kept[:, channels] = weight[:, channels]
    return kept


def awq_scales(mean_abs: torch.Tensor, alpha: float) -> torch.Tensor:
    """s = s_X^α (eq. 5), floored at 1e-4 (dead channels) and divided by √(max s · min s)."""
    scales = mean_abs.pow(alpha).clamp(min=1e-4)
    return scales / (scales.max() * scales.min()).sqrt()


def scaled_weight(weight: torch.Tensor, scales: torch.Tensor, scheme: QuantScheme
                  ) -> torch.Tensor:
    """What the scaled layer computes with, seen from the unscaled input:
    Q(W·diag(s))·diag(s)⁻¹ (eq. 4), round to nearest."""
    return fake_quantize(weight * scales, scheme) / scales


@dataclass(frozen=True)
class ScaleSearch:
    scales: torch.Tensor  # [in]: multiply the weight columns, divide the inputs
    alpha: float  # the exponent that won
    alphas: list[float]  # the grid searched
    errors: list[float]  # output error (mean over tokens, summed over layers) per alpha
    layer_errors: list[list[float]]  # per alpha, each layer's output error

    def report(self, layer: int) -> LayerReport:
        """The ``layer``-th layer's error at the chosen α and at α = 0 (s = 1: plain RTN)."""
        best = self.alphas.index(self.alpha)
        return LayerReport(self.layer_errors[best][layer], self.layer_errors[0][layer],
                           self.alpha)


def _as_list(weights: torch.Tensor | Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [weights] if isinstance(weights, torch.Tensor) else list(weights)


def search_scales(weights: torch.Tensor | Sequence[torch.Tensor], x: torch.Tensor,
                  scheme: QuantScheme, grid: int = 20,
                  mean_abs: torch.Tensor | None = None) -> ScaleSearch:
    """The grid search of eq. 5 for linear layers sharing the input ``x`` [tokens, in].

    α runs over i/grid, i = 0..grid-1; each candidate s is scored by the summed output
    error of all ``weights`` (each [out_i, in]) quantized as Q(W·diag(s))·diag(s)⁻¹.
    ``mean_abs`` (s_X) defaults to the statistic of ``x``; pass one taken over more tokens
    than ``x`` holds to score on a sample.
    """
    weights = _as_list(weights)
    if grid < 1:
        raise ValueError(f"grid must be at least 1, got {grid}")
    for weight in weights:
        if weight.shape[1] != x.shape[-1]:
            raise ValueError(f"weight {tuple(weight.shape)} does not take inputs of "
                             f"{x.shape[-1]} channels: pass the layers that read x")
    mean_abs = activation_magnitude(x) if mean_abs is None else mean_abs
    alphas = [i / grid for i in range(grid)]
    layer_errors = [[output_error(w, scaled_weight(w, awq_scales(mean_abs, alpha), scheme), x)
                     for w in weights] for alpha in alphas]
    errors = [sum(row) for row in layer_errors]
    best = min(range(grid), key=errors.__getitem__)
    return ScaleSearch(awq_scales(mean_abs, alphas[best]), alphas[best], alphas, errors,
                       layer_errors)


def tie_to_kv_heads(values: torch.Tensor, num_heads: int, num_kv_heads: int) -> torch.Tensor:
    """Average a per-channel vector over the query heads that share a KV head, and repeat
    it back: o_proj input statistics whose scales can fold into v_proj's rows."""
    if num_heads % num_kv_heads or values.numel() % num_heads:
        raise ValueError(f"{values.numel()} channels do not split into {num_heads} heads in "
                         f"groups over {num_kv_heads} KV heads")
    grouped = values.reshape(num_kv_heads, num_heads // num_kv_heads, -1)
    return grouped.mean(dim=1, keepdim=True).expand_as(grouped).reshape(-1)


def _check_scales(scales: torch.Tensor, linears: Sequence[nn.Linear]) -> None:
    for linear in linears:
        if linear.in_features != scales.numel():
            raise ValueError(f"{scales.numel()} scales for a layer with "
                             f"{linear.in_features} inputs: scales must be one per input")
    if not (scales > 0).all():
        raise ValueError("scales must be positive (awq_scales makes them so)")


@torch.no_grad()
def fold_into_norm(norm: RMSNorm, linears: Sequence[nn.Linear], scales: torch.Tensor) -> None:
    """In place: RMSNorm weight ÷ s, following linears' input columns × s. The float model
    computes the same function, (W·diag(s))·(x/s) = W·x."""
    _check_scales(scales, linears)
    norm.weight.div_(scales)
    for linear in linears:
        linear.weight.mul_(scales)


@torch.no_grad()
def fold_into_linear(previous: nn.Linear, linears: Sequence[nn.Linear],
                     scales: torch.Tensor) -> None:
    """In place: ``previous``'s output rows (and bias) ÷ s, the next linears' columns × s
    (up_proj before down_proj: silu(gate)·up is linear in up's output)."""
    _check_scales(scales, linears)
    if previous.out_features != scales.numel():
        raise ValueError(f"{scales.numel()} scales for a layer with {previous.out_features} "
                         "outputs: for v_proj -> o_proj with GQA use fold_into_values")
    previous.weight.div_(scales[:, None])
    if previous.bias is not None:
        previous.bias.div_(scales)
    for linear in linears:
        linear.weight.mul_(scales)


@torch.no_grad()
def fold_into_values(attn: Attention, scales: torch.Tensor) -> None:
    """In place: o_proj's input columns × s, v_proj's rows ÷ the matching KV-head scales.

    With GQA each value channel feeds the same channel of g query heads' outputs, so the
    scales must be equal across those heads (build them from :func:`tie_to_kv_heads`).
    """
    _check_scales(scales, [attn.o_proj])
    groups = attn.num_heads // attn.num_kv_heads
    per_head = scales.reshape(attn.num_kv_heads, groups, attn.head_dim)
    if not torch.equal(per_head, per_head[:, :1].expand_as(per_head)):
        raise ValueError("o_proj scales differ between query heads sharing a KV head: "
                         "build them from tie_to_kv_heads(...) statistics")
    value_scales = per_head[:, 0].reshape(-1)
    attn.v_proj.weight.div_(value_scales[:, None])
    if attn.v_proj.bias is not None:
        attn.v_proj.bias.div_(value_scales)
    attn.o_proj.weight.mul_(scales)


def _fold_group(block: Block, previous: str, names: Sequence[str], scales: torch.Tensor) -> None:
    """Fold ``scales`` between ``block.<previous>`` and the linears ``names`` reading it."""
    linears = [block.get_submodule(name) for name in names]
    source = block.get_submodule(previous)
    if isinstance(source, RMSNorm):
        fold_into_norm(source, linears, scales)
    elif previous == "attn.v_proj" and names == ("attn.o_proj",):
        fold_into_values(block.attn, scales)
    else:
        fold_into_linear(source, linears, scales)


def _group_width(scheme: QuantScheme, in_features: int) -> int:
    if scheme.per_tensor:
        raise ValueError("clipping is searched per group or per channel, not per tensor")
    return min(scheme.group_size or in_features, in_features)


def group_grams(x: torch.Tensor, scheme: QuantScheme) -> torch.Tensor:
    """[groups, size, size]: the mean over tokens of x_g x_gᵀ for each group g of input
    channels (the diagonal blocks of XᵀX/n). A shorter last group is zero-padded, so the
    padding columns of a grouped weight add nothing."""
    size = _group_width(scheme, x.shape[-1])
    x = torch.nn.functional.pad(x, (0, -x.shape[-1] % size))
    grouped = x.reshape(x.shape[0], -1, size).transpose(0, 1)  # [groups, tokens, size]
    return grouped.transpose(1, 2) @ grouped / x.shape[0]


def scale_grams(grams: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The Gram blocks of x / s, from those of x: H_g ÷ (s_g s_gᵀ)."""
    groups, size, _ = grams.shape
    padded = torch.nn.functional.pad(scales, (0, groups * size - scales.numel()), value=1.0)
    per_group = padded.reshape(groups, size)
    return grams / (per_group[:, :, None] * per_group[:, None, :])


def group_errors(weight: torch.Tensor, approx: torch.Tensor, grams: torch.Tensor,
                 scheme: QuantScheme) -> torch.Tensor:
    """[out, groups]: mean over tokens of (x_g · (w_g − ŵ_g))², each weight group's share
    of the output error (the reference's auto_clip objective), as d_gᵀ H_g d_g with the
    Gram blocks ``grams`` of :func:`group_grams`: every calibration token counts, at a
    cost that does not grow with their number."""
    _group_width(scheme, weight.shape[1])
    diff = _grouped(weight - approx, scheme).transpose(0, 1)  # [groups, out, size]
    return ((diff @ grams) * diff).sum(dim=-1).T


def clip_weight(weight: torch.Tensor, ratios: torch.Tensor, scheme: QuantScheme
                ) -> torch.Tensor:
    """Clamp each weight group to ± ratio × its max |w| (ratios: [out, groups]), as the
    reference code does: with an asymmetric grid only the side that reaches past the
    bound is clipped, and the grid then spans the clamped [min, max]."""
    groups = _grouped(weight, scheme)
    bound = groups.abs().amax(dim=-1, keepdim=True) * ratios[..., None]
    return _ungrouped(torch.minimum(torch.maximum(groups, -bound), bound), weight.shape, scheme)


@dataclass(frozen=True)
class ClipSearch:
    ratios: torch.Tensor  # [out, groups]: the shrink factor chosen for each group's range
    errors: torch.Tensor  # [out, groups]: group_errors with those ratios
    unclipped: torch.Tensor  # [out, groups]: group_errors of plain round to nearest


def search_clip(weight: torch.Tensor, grams: torch.Tensor, scheme: QuantScheme,
                grid: int = 20, max_shrink: float = 0.5) -> ClipSearch:
    """Per group, the ratio r in 1, 1 - 1/grid, ... (down to 1 - max_shrink, exclusive) whose
    clipped (:func:`clip_weight`) round-to-nearest weights have the least output error on
    the calibration inputs summarised by ``grams`` (:func:`group_grams`)."""
    groups = -(-weight.shape[1] // _group_width(scheme, weight.shape[1]))
    if grams.shape[0] != groups:
        raise ValueError(f"{grams.shape[0]} Gram blocks for a weight of {groups} groups: "
                         "build them with group_grams(x, scheme) for the same scheme")
    unclipped = group_errors(weight, fake_quantize(weight, scheme), grams, scheme)
    best, ratios = unclipped, torch.ones_like(unclipped)
    for step in range(1, int(max_shrink * grid)):
        trial = torch.full_like(ratios, 1 - step / grid)
        approx = fake_quantize(clip_weight(weight, trial, scheme), scheme)
        errors = group_errors(weight, approx, grams, scheme)
        better = errors < best
        best, ratios = torch.where(better, errors, best), torch.where(better, trial, ratios)
    return ClipSearch(ratios, best, unclipped)


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
        _fold_group(block, previous, names, scales)
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
