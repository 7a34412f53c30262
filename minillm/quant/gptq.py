"""GPTQ: quantize a layer's weights so its *outputs* stay close, one column at a time.

Frantar, Ashkboos, Hoefler & Alistarh, "GPTQ: Accurate Post-Training Quantization for
Generative Pre-trained Transformers" (ICLR 2023), built on Optimal Brain Surgeon (OBS,
Hassibi & Stork 1993) and Optimal Brain Quantization (OBQ, Frantar & Alistarh 2022).

**The layer-wise objective** (GPTQ eq. 1). For a linear layer with weight W [out, in] and
calibration inputs X [in, n], find the quantized Ŵ minimising ||WX - ŴX||². Rows of W do
not interact, and for each row the objective is a quadratic with Hessian H = 2XXᵀ. We keep
H as the *average* over tokens, H = 2/n Σ x xᵀ, so ``tr((W - Ŵ) H (W - Ŵ)ᵀ) / 2`` is the
mean over calibration tokens of ||Wx - Ŵx||² (:func:`layer_objective`).

**OBQ** (GPTQ eq. 2-3). Quantize one weight w_q, then move the weights F not yet quantized
to absorb the error optimally (the OBS update), and drop q from the inverse Hessian:

    δ_F = -(w_q - quant(w_q)) / [H_F⁻¹]_qq · (H_F⁻¹)_{:,q}
    H_{-q}⁻¹ = (H⁻¹ - H⁻¹_{:,q} H⁻¹_{q,:} / [H⁻¹]_qq)_{-q}          (Gaussian elimination)

**GPTQ** makes this fast with three changes (Algorithm 1):

1. *Arbitrary order*: quantize all rows column by column, in the same order. The order
   barely matters for large layers, and every row then shares one H_F.
2. *Lazy batch updates*: a column's update only touches later columns. Within a block of
   B columns we apply it at once; the rest of the matrix gets the block's updates in one
   matmul, ``W[:, later] -= Err · U[block, later]`` (eq. 4-5), which is what makes it fast.
3. *Cholesky reformulation*: the rows of the upper Cholesky factor U of H⁻¹ hold exactly
   the values the sequence of eliminations above would produce (row q of U is
   (H_F⁻¹)_{q,F} / sqrt([H_F⁻¹]_qq)), so one stable factorisation replaces n updates of
   the inverse that accumulate rounding errors. With it a column step is
   ``err = (w - quant(w)) / U_qq; W[:, q:] -= err · U[q, q:]``.

Details, as in the reference implementation: dead inputs (H_ii = 0, the input is always
zero) get H_ii = 1 and weight 0; H is damped by λ = damp · mean(diag H) before inversion;
group scales and zeros come from the current (already error-updated) weights when a group
starts. Our lazy version computes them from fully updated weights even when a group starts
inside a block and ends past it (the reference uses the block-start values there), so it
equals the plain column-by-column loop exactly.

*Act-order* ("desc_act") quantizes columns by decreasing diag(H), hardest first. We pair it
with *static groups*: each group's scale and zero come from the original weights up front
and groups stay contiguous column ranges, so the result is stored in the standard format
and :class:`~minillm.quant.qlinear.QuantLinear` needs no permutation index.

Precision: Hessians are averaged in float64 (each batch's xᵀx in float32, then added to a
float64 running mean, so thousands of tokens add without drift); the column loop runs in
float64 on CPU, where it costs little and makes the result independent of the block size.

Few calibration tokens: with 16 windows of 512 tokens (8192 tokens for Hessians of up to
1536 x 1536), GPTQ fits noise in directions the calibration text barely covers. On SmolLM2
at 3-bit g128 the paper's ``damp=0.01`` in column order then did worse than RTN; ``damp=0.1``
with ``act_order=True`` closed about half of RTN's perplexity gap (notebook 07).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial

import torch
from torch import nn

from ..linear import DEFAULT_SKIP, is_skipped
from .basic import Quantized, QuantScheme, _grouped, _ungrouped, quantize
from .calibration import BlockInputs, LayerReport, blocks_with_inputs, check_windows
from .qlinear import QuantLinear

ColumnStep = Callable[..., tuple[torch.Tensor, torch.Tensor]]  # see gptq_column_step


class HessianAccumulator:
    """The running average H = 2/n Σ x xᵀ of one layer's inputs (GPTQ's H = 2XXᵀ, per token).

    ``add(x)`` takes a batch [..., features]; after batches of n₁, n₂, ... tokens,
    ``hessian`` is 2/(n₁+n₂+...) Σ x xᵀ over all of them, in float64.
    """

    def __init__(self, features: int):
        self.hessian = torch.zeros(features, features, dtype=torch.float64)
        self.num_samples = 0

    def add(self, x: torch.Tensor) -> None:
        x = x.reshape(-1, x.shape[-1]).float()
        if x.shape[1] != self.hessian.shape[0]:
            raise ValueError(f"inputs have {x.shape[1]} features, the Hessian expects "
                             f"{self.hessian.shape[0]}")
        seen, new = self.num_samples, x.shape[0]
        self.hessian.mul_(seen / (seen + new)).add_((x.T @ x).double(), alpha=2 / (seen + new))
        self.num_samples = seen + new


def inverse_hessian_cholesky(hessian: torch.Tensor, damp: float = 0.01) -> torch.Tensor:
    """The upper Cholesky factor U of (H + λI)⁻¹ with λ = damp · mean(diag H), in float64.

    Row q of U, divided by U_qq, is the OBS update direction for column q once columns
    before q are quantized (GPTQ sec. 3, "Cholesky reformulation"; Algorithm 1).
    """
    h = hessian.double()
    h = h + damp * h.diagonal().mean() * torch.eye(len(h), dtype=h.dtype)
    try:
        inverse = torch.cholesky_inverse(torch.linalg.cholesky(h))
        return torch.linalg.cholesky(inverse, upper=True)
    except torch.linalg.LinAlgError as error:
        raise ValueError("the damped Hessian is not positive definite: raise damp (e.g. 0.1) "
                         "or calibrate on more tokens") from error


def group_grid(weights: torch.Tensor, scheme: QuantScheme) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and zero of each row of ``weights`` [rows, cols] taken as one group: basic.py's
    round-to-nearest definitions, so GPTQ's codes lie on the same grid as RTN's."""
    q = quantize(weights, replace(scheme, group_size=None, per_tensor=False))
    return q.scales[:, 0], q.zeros[:, 0]


def fake_quantize_column(column: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
                         scheme: QuantScheme) -> torch.Tensor:
    """Round ``column`` [rows] to the grid of ``scale``/``zero`` [rows]; return it dequantized."""
    return (_codes(column, scale, zero, scheme) - zero) * scale


def _codes(weight: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
           scheme: QuantScheme) -> torch.Tensor:
    """The integer codes (as floats) of :func:`minillm.quant.basic.quantize`'s grids."""
    if scheme.symmetric:
        q_max = 2 ** (scheme.bits - 1) - 1
        return torch.clamp(torch.round(weight / scale), -q_max, q_max)
    if scheme.float_zero:
        return torch.clamp(torch.round(weight / scale + zero), 0, 2**scheme.bits - 1)
    return torch.clamp(torch.round(weight / scale) + zero, 0, 2**scheme.bits - 1)


def gptq_column_step(block: torch.Tensor, i: int, u_row: torch.Tensor,
                     quantize_column: Callable[[torch.Tensor], torch.Tensor]
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize column ``i`` of ``block`` and spread its error over the later columns.

    ``u_row`` is row i of the inverse Hessian's Cholesky factor over the block's columns.
    Returns the quantized column and ``block`` (updated in place): the OBS update of
    GPTQ eq. 2 written with U, ``block[:, i:] -= (w - q) / U_ii · U[i, i:]``.
    """
    w = block[:, i]
    q = quantize_column(w)
    error = (w - q) / u_row[i]
    block[:, i:] -= error[:, None] * u_row[None, i:]
    return q, block


class _GroupGrids:
    """Scales and zeros of every group: fixed up front (static) or set when a group starts."""

    def __init__(self, weight: torch.Tensor, scheme: QuantScheme, static: bool):
        self.scheme = scheme
        self.size = min(scheme.group_size or weight.shape[1], weight.shape[1])
        self.static = static
        if static:
            fixed = quantize(weight.float(), scheme)
            self.scales, self.zeros = fixed.scales.clone(), fixed.zeros.clone()
        else:
            groups = -(-weight.shape[1] // self.size)
            self.scales = torch.zeros(weight.shape[0], groups)
            self.zeros = torch.zeros(weight.shape[0], groups)

    def starts_group(self, column: int) -> bool:
        return not self.static and column % self.size == 0

    def set_from(self, column: int, current: torch.Tensor) -> None:
        """Grid of the group starting at ``column`` from its current weights [rows, size]."""
        group = column // self.size
        self.scales[:, group], self.zeros[:, group] = group_grid(current, self.scheme)

    def quantizer(self, original_column: int) -> Callable[[torch.Tensor], torch.Tensor]:
        group = original_column // self.size
        return partial(fake_quantize_column, scale=self.scales[:, group].double(),
                       zero=self.zeros[:, group].double(), scheme=self.scheme)

    def encode(self, dequantized: torch.Tensor) -> Quantized:
        """The codes that give ``dequantized`` back, as a :class:`Quantized` weight."""
        groups = _grouped(dequantized, self.scheme)
        scales, zeros = self.scales.double()[..., None], self.zeros.double()[..., None]
        codes = _codes(groups, scales, zeros, self.scheme)
        dtype = torch.int8 if self.scheme.symmetric else torch.uint8
        return Quantized(_ungrouped(codes.to(dtype), dequantized.shape, self.scheme),
                         self.scales, self.zeros, self.scheme)


def gptq_quantize_weight(weight: torch.Tensor, hessian: torch.Tensor, scheme: QuantScheme,
                         block_size: int = 128, damp: float = 0.01, act_order: bool = False,
                         column_step: ColumnStep = gptq_column_step) -> Quantized:
    """GPTQ (Algorithm 1) of ``weight`` [out, in] given its input Hessian [in, in].

    Returns a :class:`Quantized` in the original column order, ready for
    ``QuantLinear(quantized, bias)``. ``block_size`` columns are updated eagerly, the rest
    lazily; ``act_order`` processes columns by decreasing diag(H) with static groups.
    ``column_step`` is the per-column update (swap in your own to test it).
    """
    _check_inputs(weight, hessian, scheme, block_size, damp)
    w = weight.detach().double().clone()
    h = hessian.detach().double().clone()
    dead = h.diagonal() == 0  # inputs that are always zero: any weight is as good as 0
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    grids = _GroupGrids(w, scheme, static=act_order)
    columns = w.shape[1]
    order = (torch.argsort(h.diagonal(), descending=True, stable=True) if act_order
             else torch.arange(columns))
    w, u = w[:, order], inverse_hessian_cholesky(h[order][:, order], damp)
    result = torch.zeros_like(w)
    for start in range(0, columns, block_size):
        stop = min(start + block_size, columns)
        result[:, start:stop], errors = _quantize_block(w, u, start, stop, order, grids,
                                                        column_step)
        w[:, stop:] -= errors @ u[start:stop, stop:]  # the lazy update of all later columns
    return grids.encode(result[:, torch.argsort(order)])


def _quantize_block(w, u, start, stop, order, grids, column_step):
    """Columns start..stop one by one with eager error feedback inside the block; returns
    the quantized columns and the scaled errors (w - q) / U_qq for the lazy update."""
    block = w[:, start:stop].clone()
    quantized, errors = torch.zeros_like(block), torch.zeros_like(block)
    for i in range(stop - start):
        column = start + i
        if grids.starts_group(column):
            end = min(column + grids.size, w.shape[1])
            grids.set_from(column, _current_weights(w, block, errors, u, start, stop,
                                                    column, end))
        original = block[:, i].clone()
        quantized[:, i], block = column_step(block, i, u[column, start:stop],
                                             grids.quantizer(int(order[column])))
        errors[:, i] = (original - quantized[:, i]) / u[column, column]
    return quantized, errors


def _current_weights(w, block, errors, u, start, stop, first, end):
    """Columns first..end with every update so far: from the block, and for columns past the
    block, ``w`` minus the block's pending lazy update."""
    inside = block[:, first - start:min(end, stop) - start]
    if end <= stop:
        return inside
    return torch.cat([inside, w[:, stop:end] - errors @ u[start:stop, stop:end]], dim=1)


def _check_inputs(weight, hessian, scheme, block_size, damp):
    if weight.ndim != 2:
        raise ValueError(f"weight must be [out, in], got shape {tuple(weight.shape)}")
    if hessian.shape != (weight.shape[1], weight.shape[1]):
        raise ValueError(f"hessian must be [in, in] = {(weight.shape[1],) * 2} for a weight of "
                         f"shape {tuple(weight.shape)}, got {tuple(hessian.shape)}")
    if not torch.isfinite(hessian).all():
        raise ValueError("the Hessian has NaN or inf entries: check the calibration inputs")
    if scheme.per_tensor:
        raise ValueError("GPTQ quantizes per channel or per group: use group_size=None "
                         "or an integer, not per_tensor=True")
    if block_size < 1 or damp < 0:
        raise ValueError(f"block_size must be >= 1 and damp >= 0, got {block_size}, {damp}")


def layer_objective(weight: torch.Tensor, approx: torch.Tensor, hessian: torch.Tensor) -> float:
    """tr((W - Ŵ) H (W - Ŵ)ᵀ) / 2: with H = 2/n Σ x xᵀ, the mean over the calibration tokens
    of ||Wx - Ŵx||² (GPTQ eq. 1)."""
    delta = (weight.detach().double() - approx.detach().double())
    return float((delta @ hessian.double() * delta).sum() / 2)


def collect_hessians(block: nn.Module, inputs: BlockInputs) -> list[tuple[list[str],
                                                                          torch.Tensor]]:
    """One capture pass over ``block``: ``[(names, hessian)]``, one Hessian per distinct
    input. Layers fed the same tensor (q/k/v; gate/up) share one, built once."""
    accumulators: dict[str, HessianAccumulator] = {}
    owner_of: dict[str, str] = {}
    previous: list = []  # [name, x] of the last call; holding x keeps its memory unique

    def on_input(name: str, x: torch.Tensor) -> None:
        shared = previous and _same_tensor(previous[1], x)
        owner = owner_of.setdefault(name, owner_of[previous[0]] if shared else name)
        if owner == name:
            accumulators.setdefault(name, HessianAccumulator(x.shape[-1])).add(x)
        previous[:] = [name, x]

    inputs.capture(block, on_input)
    return [([n for n, o in owner_of.items() if o == owner], acc.hessian)
            for owner, acc in accumulators.items()]


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()


def quantize_model_gptq(model: nn.Module, scheme: QuantScheme, *, windows: torch.Tensor,
                        skip: tuple[str, ...] = DEFAULT_SKIP, block_size: int = 128,
                        damp: float = 0.1, act_order: bool = True, batch_size: int = 8,
                        progress: bool = True,
                        report: dict[str, LayerReport] | None = None) -> nn.Module:
    """Quantize every linear layer of ``model``'s blocks with GPTQ, in place.

    ``windows`` [n, seq] are calibration tokens (``calibration_windows``). Blocks are done
    in order, each calibrated on the outputs of the already quantized blocks before it.
    Layers whose name (``"layers.3.mlp.up_proj"``) contains a ``skip`` entry stay float.
    Pass a dict as ``report`` to get each layer's objective with GPTQ and with RTN.
    The defaults ``damp=0.1, act_order=True`` are the setting measured best on SmolLM2
    (notebook 07); the paper's ``damp=0.01`` in column order overfits a few windows.
    """
    check_windows(windows)
    for index, block, inputs in blocks_with_inputs(model, windows, batch_size, progress,
                                                   desc="GPTQ"):
        for names, hessian in collect_hessians(block, inputs):
            names = [n for n in names if not is_skipped(f"layers.{index}.{n}", skip)]
            if not names:
                continue
            weight = stacked_weight(block, names)  # rows are independent: one matrix per H
            quantized = gptq_quantize_weight(weight, hessian, scheme, block_size, damp,
                                             act_order)
            if report is not None:
                report.update(_objectives(f"layers.{index}", block, names, quantized, hessian))
            install_quantized(block, names, quantized)
    return model


def stacked_weight(module: nn.Module, names: list[str]) -> torch.Tensor:
    """The weights of the linear layers ``names`` of ``module``, stacked row-wise."""
    return torch.cat([module.get_submodule(name).weight.detach() for name in names])


def install_quantized(module: nn.Module, names: list[str], quantized: Quantized) -> None:
    """Replace the ``nn.Linear`` layers ``names`` of ``module`` by :class:`QuantLinear` layers
    holding consecutive row ranges of ``quantized`` (layers quantized as one stacked matrix,
    see :func:`stacked_weight`), keeping their biases."""
    layers = [module.get_submodule(name) for name in names]
    parts = _split_rows(quantized, [layer.out_features for layer in layers])
    for name, layer, part in zip(names, layers, parts, strict=True):
        module.set_submodule(name, QuantLinear(part, layer.bias))


def _split_rows(quantized: Quantized, sizes: list[int]) -> list[Quantized]:
    pieces = zip(quantized.codes.split(sizes), quantized.scales.split(sizes),
                 quantized.zeros.split(sizes), strict=True)
    return [Quantized(c.clone(), s.clone(), z.clone(), quantized.scheme) for c, s, z in pieces]


def _objectives(prefix: str, module: nn.Module, names: list[str], quantized: Quantized,
                hessian: torch.Tensor) -> dict[str, LayerReport]:
    """Each layer's objective with its rows of the stacked GPTQ result and with round to
    nearest (call before :func:`install_quantized` replaces the float layers)."""
    weights = [module.get_submodule(name).weight.detach() for name in names]
    gptq_rows = quantized.dequantize().split([len(w) for w in weights])
    return {f"{prefix}.{name}": LayerReport(
                error=layer_objective(w, rows, hessian),
                rtn_error=layer_objective(w, quantize(w, quantized.scheme).dequantize(), hessian))
            for name, w, rows in zip(names, weights, gptq_rows, strict=True)}
