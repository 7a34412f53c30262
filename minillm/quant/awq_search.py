"""AWQ's scale search (§3.1-3.2 of the paper; :mod:`minillm.quant.awq` explains it all):
which input channels are salient, the scales s = s_X^α that protect them, and the grid
search over α that scores each candidate by the output error on calibration inputs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from .awq_clip import group_grams
from .basic import QuantScheme, fake_quantize
from .calibration import LayerReport


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
