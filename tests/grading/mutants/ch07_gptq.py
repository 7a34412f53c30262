"""Plausible wrong answers to chapter 07 (GPTQ); the graded tests must catch each one.
Each mutant replaces the solution function named before its ``__``."""

import torch

from minillm.quant.gptq import fake_quantize_column, group_grid


def accumulate_hessian__sums_not_averages(hessian, num_samples, x):
    """Adds 2 xᵀx to a running sum but never divides by the number of tokens."""
    x = x.double()
    return hessian + 2 * x.T @ x, num_samples + x.shape[0]


def accumulate_hessian__averages_batches(hessian, num_samples, x):
    """Averages the batches' Hessians with equal weights, whatever their token counts."""
    x = x.double()
    batch = 2 * x.T @ x / x.shape[0]
    new = batch if num_samples == 0 else (hessian + batch) / 2
    return new, num_samples + x.shape[0]


def accumulate_hessian__float32_products(hessian, num_samples, x):
    """Forms xᵀx in float32 and only then converts: the products lose digits."""
    total = num_samples + x.shape[0]
    x = x.float()
    return hessian * (num_samples / total) + ((2 / total) * x.T @ x).double(), total


def inverse_hessian_cholesky__lower_factor(hessian, damp=0.01):
    """Returns the lower Cholesky factor L of the inverse instead of the upper U."""
    h = hessian.double()
    h = h + damp * h.diagonal().mean() * torch.eye(len(h), dtype=h.dtype)
    return torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)))


def inverse_hessian_cholesky__absolute_damping(hessian, damp=0.01):
    """Adds damp · I instead of damp · mean(diag H) · I."""
    h = hessian.double()
    h = h + damp * torch.eye(len(h), dtype=h.dtype)
    return torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)


def inverse_hessian_cholesky__factor_of_hessian(hessian, damp=0.01):
    """Factors H + λI itself, forgetting to invert it."""
    h = hessian.double()
    h = h + damp * h.diagonal().mean() * torch.eye(len(h), dtype=h.dtype)
    return torch.linalg.cholesky(h, upper=True)


def gptq_column_step__no_division(block, i, u_row, quantize_column):
    """Pushes w - q onto the later columns without dividing by U_ii."""
    w = block[:, i]
    q = quantize_column(w)
    block[:, i:] -= (w - q)[:, None] * u_row[None, i:]
    return q, block


def gptq_column_step__later_columns_only(block, i, u_row, quantize_column):
    """Updates columns i+1.. but leaves column i at its unquantized value."""
    w = block[:, i]
    q = quantize_column(w)
    error = (w - q) / u_row[i]
    block[:, i + 1:] -= error[:, None] * u_row[None, i + 1:]
    return q, block


def gptq_column_step__adds_error(block, i, u_row, quantize_column):
    """Adds the scaled error instead of subtracting it."""
    w = block[:, i]
    q = quantize_column(w)
    error = (w - q) / u_row[i]
    block[:, i:] += error[:, None] * u_row[None, i:]
    return q, block


def _gptq(weight, hessian, scheme, damp, grid_weights, u_row):
    """The solution's loop, with ``grid_weights(w, c, size)`` the weights a group's grid is
    taken from and ``u_row(u, c)`` the update direction of column c."""
    from solutions.ch07_gptq import gptq_column_step, inverse_hessian_cholesky

    w = weight.double().clone()
    u = inverse_hessian_cholesky(hessian, damp)
    columns = w.shape[1]
    size = min(scheme.group_size or columns, columns)
    result = torch.zeros_like(w)
    for c in range(columns):
        if c % size == 0:
            scale, zero = (t.double() for t in group_grid(grid_weights(w, c, size), scheme))
        result[:, c], w = gptq_column_step(
            w, c, u_row(u, c), lambda col, s=scale, z=zero: fake_quantize_column(col, s, z, scheme))
    return result


def gptq_unblocked__grid_from_original_weight(weight, hessian, scheme, damp=0.01):
    """Takes each group's scale and zero from the original weights, not the updated ones."""
    original = weight.double()
    return _gptq(weight, hessian, scheme, damp, lambda w, c, size: original[:, c:c + size],
                 lambda u, c: u[c])


def gptq_unblocked__column_of_u(weight, hessian, scheme, damp=0.01):
    """Uses column c of U (zero below the diagonal) instead of row c."""
    return _gptq(weight, hessian, scheme, damp, lambda w, c, size: w[:, c:c + size],
                 lambda u, c: u[:, c])


def gptq_unblocked__no_error_feedback(weight, hessian, scheme, damp=0.01):
    """Rounds every column to nearest, pushing no error onto the later columns."""
    w = weight.double()
    columns = w.shape[1]
    size = min(scheme.group_size or columns, columns)
    result = torch.zeros_like(w)
    for start in range(0, columns, size):
        scale, zero = (t.double() for t in group_grid(w[:, start:start + size], scheme))
        for c in range(start, min(start + size, columns)):
            result[:, c] = fake_quantize_column(w[:, c], scale, zero, scheme)
    return result
