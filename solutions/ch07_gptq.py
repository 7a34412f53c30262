"""Chapter 07: GPTQ — quantize a layer column by column, letting later columns absorb the error."""

from __future__ import annotations

from collections.abc import Callable

import torch

from minillm.quant.basic import QuantScheme
from minillm.quant.gptq import fake_quantize_column, group_grid


def accumulate_hessian(hessian: torch.Tensor, num_samples: int,
                       x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Exercise 07.1: Fold a batch of layer inputs into the running Hessian H = 2/n Σ x xᵀ.

    hessian: [d, d] float64, the average of 2 x xᵀ over the num_samples tokens seen so far
    (zeros when num_samples is 0); x: [tokens, d] (any float dtype). Returns the new
    (hessian, num_samples): the average over all num_samples + tokens inputs.
    Hint: scale the old average by n / (n + m) and add 2 / (n + m) · xᵀx.
    """
    ### BEGIN SOLUTION
    x = x.double()
    total = num_samples + x.shape[0]
    return hessian * (num_samples / total) + (2 / total) * x.T @ x, total
    ### END SOLUTION


def inverse_hessian_cholesky(hessian: torch.Tensor, damp: float = 0.01) -> torch.Tensor:
    """Exercise 07.2: Return the upper Cholesky factor U of the damped inverse Hessian.

    U is upper triangular with UᵀU = (H + λI)⁻¹, where λ = damp · mean(diag H); compute in
    float64. Row q of U holds the OBS update direction for column q (GPTQ, Algorithm 1).
    Hint: torch.linalg.cholesky gives the lower factor L of H + λI;
    torch.cholesky_inverse(L) is (H + λI)⁻¹; torch.linalg.cholesky(..., upper=True).
    """
    ### BEGIN SOLUTION
    h = hessian.double()
    h = h + damp * h.diagonal().mean() * torch.eye(len(h), dtype=h.dtype)
    inverse = torch.cholesky_inverse(torch.linalg.cholesky(h))
    return torch.linalg.cholesky(inverse, upper=True)
    ### END SOLUTION


def gptq_column_step(block: torch.Tensor, i: int, u_row: torch.Tensor,
                     quantize_column: Callable[[torch.Tensor], torch.Tensor]
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Exercise 07.3: Quantize column i of block and push its error onto the later columns.

    block: [rows, cols] current weights of the columns being processed; u_row: [cols], row i
    of the Cholesky factor U restricted to these columns (u_row[i] is U_ii);
    quantize_column(w) rounds a column [rows] to its grid and returns it dequantized.
    Returns (q, block): the quantized column and the block after the OBS update
    block[:, i:] -= (w - q) / U_ii · U[i, i:]. Updating block in place is fine.
    """
    ### BEGIN SOLUTION
    w = block[:, i]
    q = quantize_column(w)
    error = (w - q) / u_row[i]
    block[:, i:] -= error[:, None] * u_row[None, i:]
    return q, block
    ### END SOLUTION


def gptq_unblocked(weight: torch.Tensor, hessian: torch.Tensor, scheme: QuantScheme,
                   damp: float = 0.01) -> torch.Tensor:
    """Exercise 07.4: Run GPTQ on a whole layer, one column at a time, without lazy batching.

    weight: [out, in]; hessian: [in, in] (no dead inputs); scheme: per channel
    (group_size=None) or grouped. Returns the quantized weight, dequantized, in float64.
    Work on a float64 copy of the weight. Columns go left to right; when a group starts
    (column % group_size == 0, or column 0 per channel) take its scale and zero from the
    *current* weights of its columns with group_grid(w[:, c:c + size], scheme); then use
    your gptq_column_step on the whole matrix with row c of your inverse_hessian_cholesky.
    Hint: quantize_column can be lambda col: fake_quantize_column(col, scale, zero, scheme)
    with scale and zero in float64.
    """
    ### BEGIN SOLUTION
    w = weight.double().clone()
    u = inverse_hessian_cholesky(hessian, damp)
    columns = w.shape[1]
    size = min(scheme.group_size or columns, columns)
    result = torch.zeros_like(w)
    scale = zero = None
    for c in range(columns):
        if c % size == 0:
            scale, zero = (t.double() for t in group_grid(w[:, c:c + size], scheme))
        result[:, c], w = gptq_column_step(
            w, c, u[c], lambda col, s=scale, z=zero: fake_quantize_column(col, s, z, scheme))
    return result
    ### END SOLUTION
