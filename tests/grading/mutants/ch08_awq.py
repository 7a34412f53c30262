"""Plausible wrong answers to chapter 08 (AWQ); the graded tests must catch each one.
Each mutant replaces the solution function named before its ``__``."""



def activation_magnitude__mean_of_batch_means(batches):
    """Averages the batches' means: a batch of 1 token weighs as much as one of 100."""
    means = [b.reshape(-1, b.shape[-1]).abs().mean(dim=0) for b in batches]
    return sum(means) / len(means)


def activation_magnitude__no_abs(batches):
    """Averages x instead of |x|: positive and negative activations cancel."""
    flat = [b.reshape(-1, b.shape[-1]) for b in batches]
    return sum(f.sum(dim=0) for f in flat) / sum(f.shape[0] for f in flat)


def activation_magnitude__rms(batches):
    """Takes the root mean square instead of the mean magnitude."""
    flat = [b.reshape(-1, b.shape[-1]) for b in batches]
    return (sum(f.pow(2).sum(dim=0) for f in flat) / sum(f.shape[0] for f in flat)).sqrt()


def _search(weight, x, quantize_fn, grid, alphas, normalise, error_of, prefer_later=False):
    """The solution's search with replaceable alphas, normalisation, error and tie rule."""
    mean_abs = x.abs().mean(dim=0)
    best = None
    for alpha in alphas(grid):
        s = normalise(mean_abs.pow(alpha))
        effective = quantize_fn(weight * s) / s
        error = error_of(weight - effective, x)
        if best is None or error < best[0] or (prefer_later and error == best[0]):
            best = (error, s, alpha)
    return best[1], best[2]


def _alphas(grid):
    return [i / grid for i in range(grid)]


def _normalise(s):
    s = s.clamp(min=1e-4)
    return s / (s.max() * s.min()).sqrt()


def _output_error(difference, x):
    return (x @ difference.T).pow(2).sum().item()


def search_scales__last_tie_wins(weight, x, quantize_fn, grid=20):
    """Keeps the last of equally good alphas (<= instead of <), not the first."""
    return _search(weight, x, quantize_fn, grid, _alphas, _normalise, _output_error,
                   prefer_later=True)


def search_scales__no_normalisation(weight, x, quantize_fn, grid=20):
    """Skips the division by sqrt(max s · min s)."""
    return _search(weight, x, quantize_fn, grid, _alphas, lambda s: s.clamp(min=1e-4),
                   _output_error)


def search_scales__floor_after_normalising(weight, x, quantize_fn, grid=20):
    """Normalises before flooring: a dead channel (s = 0) divides by zero."""
    def normalise(s):
        return (s / (s.max() * s.min()).sqrt()).clamp(min=1e-4)
    return _search(weight, x, quantize_fn, grid, _alphas, normalise, _output_error)


def search_scales__alpha_up_to_one(weight, x, quantize_fn, grid=20):
    """Tries alpha = i / (grid - 1), so the grid runs up to 1 with a wider step."""
    return _search(weight, x, quantize_fn, grid, lambda g: [i / (g - 1) for i in range(g)],
                   _normalise, _output_error)


def search_scales__weight_error(weight, x, quantize_fn, grid=20):
    """Scores ||W - W_eff||² on the weights instead of the error of the layer's outputs."""
    return _search(weight, x, quantize_fn, grid, _alphas, _normalise,
                   lambda difference, x: difference.pow(2).sum().item())


def fold_scales__multiplies_norm(norm_weight, weights, scales):
    """Multiplies the norm weight by s and divides the linears: the inverse fold."""
    return norm_weight * scales, [w / scales for w in weights]


def fold_scales__in_place(norm_weight, weights, scales):
    """Modifies the caller's tensors in place instead of returning new ones."""
    for w in weights:
        w.mul_(scales)
    return norm_weight.div_(scales), list(weights)


def fold_scales__scales_rows(norm_weight, weights, scales):
    """Scales the linears' output rows instead of their input columns."""
    return norm_weight / scales, [w * scales[:, None] for w in weights]
