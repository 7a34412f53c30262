"""What the graded tests of chapter 12, section 9 share (``test_ch12_kv_quant.py`` and
``test_ch12_kv_quant__kivi_block.py``): Hypothesis settings, random keys and values with
the cases where a rounding mistake hides, and an exact comparison with the library's
tensors. Not a test file: the graded files import it."""

from __future__ import annotations

import torch
from hypothesis import settings
from hypothesis import strategies as st

HIDDEN = settings(max_examples=80, deadline=None, derandomize=True, database=None)
EPS = torch.finfo(torch.float32).eps


def assert_same(yours: torch.Tensor, library: torch.Tensor, what: str) -> None:
    """Equal dtype, shape and every element (the library never gives NaN)."""
    assert (yours.dtype, tuple(yours.shape)) == (library.dtype, tuple(library.shape)), \
        f"{what}: yours {yours.dtype} {tuple(yours.shape)}, the library's {library.dtype} " \
        f"{tuple(library.shape)}"
    differ = yours != library
    if differ.any():
        at = tuple(differ.nonzero()[0].tolist())
        raise AssertionError(f"{what}: {int(differ.sum())} of {differ.numel()} differ; at "
                             f"{at} yours {yours[at].item()}, the library's {library[at].item()}")


@st.composite
def tensors(draw, shape: tuple[int, ...] | None = None) -> torch.Tensor:
    """Random keys or values (of ``shape``, or a random one), with what a mistake hides
    behind: an outlier channel, rows of zeros, constant rows, tiny magnitudes, large ones,
    a constant offset, and half-precision inputs."""
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    if shape is None:
        shape = (*draw(st.lists(st.integers(1, 5), min_size=1, max_size=3)),
                 draw(st.integers(1, 70)))
    x = torch.randn(*shape, generator=g) * draw(st.sampled_from([1.0, 1e-3, 300.0, 1e-30]))
    if draw(st.booleans()):  # an outlier channel, as SmolLM2's keys have
        x[..., draw(st.integers(0, shape[-1] - 1))] *= draw(st.sampled_from([20.0, -1e4]))
    if draw(st.booleans()):  # some rows zero, some constant
        rows = torch.rand(*shape[:-1], 1, generator=g)
        x = torch.where(rows < 0.2, 0.0, torch.where(rows > 0.8, x[..., :1], x))
    if draw(st.booleans()):  # a constant offset: int4's minimum is not 0
        x = x + 2.0 * x.abs().amax()
    dtype = draw(st.sampled_from([torch.float32, torch.float32, torch.bfloat16,
                                  torch.float16]))
    return x.to(dtype) if x.abs().amax() < 6e4 else x  # fp16 would overflow
