"""Graded tests for chapter 17 (the CPU decode step): your int8 GEMV in C++.

Oracles: the product written out in float64 (the integer sums are exact there), on seeded
random shapes and values, every tail length a vector loop can leave, the extremes that
overflow 16-bit sums, and zero scales; then the engine: SmolLM2 with its first block in
W8A8 must write the same greedy tokens with your kernel as with the library's.

Each distinct source is compiled once (a second or two) and cached by its content. Without
a C++ compiler every test here is skipped, with the reason (install one to be graded).
"""

from __future__ import annotations

import copy

import pytest
import torch

from minillm.grading import load_impl
from minillm.inline_cpp import compiler_problem
from minillm.quant import QuantScheme, quantize_model
from minillm.quant.int8_activations import to_int8_activations
from minillm.sampling import SamplingParams
from minillm.serve import LLM
from minillm.transform import copy_modules

impl = load_impl("ch17_cpu_kernels")

pytestmark = [
    pytest.mark.skipif(compiler_problem() is not None,
                       reason=f"chapter 17's lab needs C++: {compiler_problem()}"),
    pytest.mark.timeout(120),  # a test that compiles a source: seconds, more on a busy machine
]

# Three float32 roundings separate your result from the exact one: float(S), the product
# of the two scales, and the last product (each at most half a unit in the last place).
RTOL = 3 * 2.0 ** -24 + 1e-9
SMOLLM2_IN = (576, 1536)  # the inputs of SmolLM2's products: hidden size, MLP width


def reference(x_codes, x_scales, x_zeros, w_codes, w_scales) -> torch.Tensor:
    """y[r, o] = S[r, o] * x_scales[r] * w_scales[o] in float64, S exact."""
    sums = (x_codes.double() - x_zeros.double()[:, None]) @ w_codes.double().T
    return sums * x_scales.double()[:, None] * w_scales.double()[None, :]


def case(rows: int, out: int, in_features: int, seed: int) -> tuple[torch.Tensor, ...]:
    """Random codes, zero points and (log-uniform) scales of the given shape."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, 256, (rows, in_features), dtype=torch.uint8, generator=g),
            10 ** (-4 * torch.rand(rows, generator=g)),
            torch.randint(0, 256, (rows,), dtype=torch.int32, generator=g),
            torch.randint(-128, 128, (out, in_features), dtype=torch.int8, generator=g),
            10 ** (-1 - 3 * torch.rand(out, generator=g)))


def assert_exact(args: tuple[torch.Tensor, ...]) -> None:
    y = impl.int8_gemv(*args)
    expected = reference(*args)
    assert y.shape == expected.shape and y.dtype == torch.float32
    error = (y.double() - expected).abs()
    worst = int((error - RTOL * expected.abs()).argmax())
    assert bool((error <= RTOL * expected.abs()).all()), (
        f"rows, out, in = {tuple(args[0].shape[:1]) + tuple(args[3].shape)}: y.flatten()"
        f"[{worst}] = {y.flatten()[worst].item()!r}, expected {expected.flatten()[worst].item()!r}")


# -- 17.1 the int8 GEMV --------------------------------------------------------------------

@pytest.mark.exercise("17.1", points=3)
@pytest.mark.parametrize("seed", range(6))
def test_equals_the_float64_product_on_random_shapes(seed):
    g = torch.Generator().manual_seed(100 + seed)
    rows = int(torch.randint(1, 5, (), generator=g))
    out = int(torch.randint(1, 300, (), generator=g))
    in_features = int(torch.randint(1, 800, (), generator=g))
    assert_exact(case(rows, out, in_features, seed))


@pytest.mark.exercise("17.1", points=2)
def test_every_tail_length():
    """in = 1 .. 130: whatever the vector width (up to 64 bytes), every remainder occurs."""
    for in_features in range(1, 131):
        assert_exact(case(2, 5, in_features, in_features))


@pytest.mark.exercise("17.1", points=1)
@pytest.mark.parametrize("shape", [(1, 1, 1), (1, 1, 576), (3, 1, 37), (1, 576, 1)])
def test_a_single_output_input_or_row(shape):
    assert_exact(case(*shape, seed=sum(shape)))


@pytest.mark.exercise("17.1", points=2)
@pytest.mark.parametrize("weight", [-128, 127])
def test_the_extremes_do_not_overflow(weight):
    """Row 0: codes 255, zero point 0; row 1: codes 0, zero point 255. Each product is
    ±255 · 128 at most, a pair of them already past int16, the sum of 1,536 past 2^24."""
    in_features = SMOLLM2_IN[1]
    x_codes = torch.tensor([[255] * in_features, [0] * in_features], dtype=torch.uint8)
    x_zeros = torch.tensor([0, 255], dtype=torch.int32)
    w_codes = torch.full((3, in_features), weight, dtype=torch.int8)
    assert_exact((x_codes, torch.tensor([1.0, 0.5]), x_zeros, w_codes,
                  torch.tensor([1.0, 2.0 ** -20, 3.0])))


@pytest.mark.exercise("17.1", points=1)
def test_zero_scales_give_exact_zeros():
    x_codes, x_scales, x_zeros, w_codes, w_scales = case(3, 40, 70, seed=7)
    x_scales[1], w_scales[[0, 17]] = 0.0, 0.0
    y = impl.int8_gemv(x_codes, x_scales, x_zeros, w_codes, w_scales)
    assert torch.equal(y[1], torch.zeros(40)) and not y.isnan().any()
    assert torch.equal(y[:, [0, 17]], torch.zeros(3, 2))
    assert_exact((x_codes, x_scales, x_zeros, w_codes, w_scales))


@pytest.mark.exercise("17.1", points=3)
@pytest.mark.timeout(240)  # SmolLM2 twice through the engine, eagerly
def test_your_block_writes_the_library_tokens(smollm2, tokenizer):
    """SmolLM2 with its first block in W8A8: your seven products instead of the library's,
    and the greedy tokens of the engine unchanged."""
    scheme = QuantScheme(8, symmetric=True, group_size=None)
    library = copy_modules(smollm2)
    library.set_submodule("layers.0", to_int8_activations(
        quantize_model(copy.deepcopy(smollm2.layers[0]), "rtn", scheme)))
    yours = impl.with_your_gemv(library, "layers.0.")
    assert sum(type(m).__name__ == "YourInt8Linear" for m in yours.modules()) == 7
    prompts = [tokenizer.chat_prompt("Name three colours."),
               tokenizer.chat_prompt("What is 12 times 12?")]
    params = SamplingParams(max_tokens=10, temperature=0)
    got = LLM(yours, tokenizer=tokenizer, executor="eager", num_blocks=32).generate(
        prompts, params, progress=False)
    for output in got:
        assert output.error is None, output.error
    expected = LLM(library, tokenizer=tokenizer, executor="eager", num_blocks=32).generate(
        prompts, params, progress=False)
    for output, reference_output in zip(got, expected, strict=True):
        assert output.tokens == reference_output.tokens, (output.text, reference_output.text)
