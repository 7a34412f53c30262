"""Graded tests for chapter 18's lab: the top-k router (18.1), the grouped expert
dispatch (18.2) and DeepSeek-V3's router (18.3).

Oracles: the library's :func:`minillm.moe.softmax_routing`, :func:`minillm.moe.dispatch`
and :func:`minillm.moe.sigmoid_routing` on hidden random cases drawn by Hypothesis (fixed,
derandomized), logits with ties, skewed routings that leave experts idle or crowded, a
loop over tokens in float64, and the work done counted by the operators PyTorch
dispatches (per expert, never per token). Then the engine: SmolLM2 with its MLPs cut
into 8 experts, routed and dispatched by your functions, writes the dense model's tokens
with all experts on and the library's with 4 of 8.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from minillm import moe
from minillm.grading import load_impl
from minillm.sampling import SamplingParams
from minillm.serve import LLM

impl = load_impl("ch18_moe")
HIDDEN = settings(max_examples=80, deadline=None, derandomize=True, database=None)
PRODUCTS = {"mm", "addmm", "bmm", "mv", "addmv", "dot", "vdot", "baddbmm", "addbmm",
            "_grouped_mm", "matmul", "linear", "einsum"}


class OpCounter(TorchDispatchMode):
    """While entered, counts every ATen operator this thread runs, by name."""

    def __init__(self):
        super().__init__()
        self.ops: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))

    def products(self) -> int:
        return sum(n for name, n in self.ops.items() if name in PRODUCTS)


@st.composite
def router_cases(draw):
    tokens, experts = draw(st.integers(1, 24)), draw(st.integers(1, 16))
    k = draw(st.integers(1, experts))
    seed, ties = draw(st.integers(0, 2**31)), draw(st.booleans())
    g = torch.Generator().manual_seed(seed)
    if ties:  # few distinct values: ties everywhere, at the k-th place too
        logits = torch.randint(-2, 3, (tokens, experts), generator=g).float()
    else:
        logits = torch.randn(tokens, experts, generator=g) * draw(st.sampled_from([0.1, 1, 8]))
    return logits, k, draw(st.booleans())


@pytest.mark.exercise("18.1", points=3)
@HIDDEN
@given(router_cases())
def test_router_matches_the_library(case):
    logits, k, normalize = case
    ids, weights = impl.route_top_k(logits.clone(), k, normalize)
    expected_ids, expected_weights = moe.softmax_routing(logits, k, normalize)
    assert ids.dtype == torch.int64 and weights.dtype == torch.float32
    assert torch.equal(ids, expected_ids), (logits, k)
    torch.testing.assert_close(weights, expected_weights, rtol=1e-6, atol=1e-7)


@pytest.mark.exercise("18.1", points=1)
def test_router_edge_cases():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0], [0.0, 0.0, 0.0, 0.0, 0.0]])
    ids, weights = impl.route_top_k(logits, 2, normalize=False)
    assert ids.tolist() == [[1, 2], [0, 1]]  # ties to the lower expert id
    torch.testing.assert_close(weights, logits.softmax(-1)[:, :3][:, [1, 2]])
    ids, weights = impl.route_top_k(logits.to(torch.bfloat16), 5, normalize=True)
    assert ids.tolist() == [[1, 2, 4, 0, 3], [0, 1, 2, 3, 4]]
    torch.testing.assert_close(weights.sum(-1), torch.ones(2))  # all E kept: sums to 1
    ids, weights = impl.route_top_k(torch.tensor([[-50.0, 0.0, 50.0]]), 1, normalize=True)
    assert ids.tolist() == [[2]] and weights.tolist() == [[1.0]]


@st.composite
def grouped_cases(draw):
    groups, size = draw(st.integers(1, 4)), draw(st.integers(2, 5))
    top_groups = draw(st.integers(1, groups))
    k = draw(st.integers(1, top_groups * size))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    logits = torch.randn(draw(st.integers(1, 20)), groups * size, generator=g)
    bias = torch.randn(groups * size, generator=g) * draw(st.sampled_from([0.0, 0.1, 1.0]))
    return logits, k, bias, groups, top_groups, draw(st.sampled_from([1.0, 2.5]))


@pytest.mark.exercise("18.3", points=2)
@HIDDEN
@given(grouped_cases())
def test_deepseek_router_matches_the_library(case):
    logits, k, bias, groups, top_groups, scale = case
    ids, weights = impl.route_sigmoid_grouped(logits.clone(), k, bias.clone(), groups,
                                              top_groups, scale)
    expected_ids, expected_weights = moe.sigmoid_routing(logits, k, True, bias, groups,
                                                         top_groups, scale)
    assert ids.dtype == torch.int64 and weights.dtype == torch.float32
    assert torch.equal(ids, expected_ids), (logits, bias, k, groups, top_groups)
    torch.testing.assert_close(weights, expected_weights, rtol=1e-6, atol=1e-7)


@pytest.mark.exercise("18.3", points=1)
def test_deepseek_router_edge_cases():
    s = torch.tensor([2.0, 0.0, -1.0, -2.0]).sigmoid()
    ids, weights = impl.route_sigmoid_grouped(torch.tensor([[2.0, 0.0, -1.0, -2.0]]), 2,
                                              torch.tensor([0.0, 0.0, 0.0, 5.0]), 1, 1, 2.5)
    assert ids.tolist() == [[3, 0]]  # the bias chooses expert 3, but does not weigh it
    torch.testing.assert_close(weights, 2.5 * s[[3, 0]][None] / s[[3, 0]].sum())
    logits = torch.tensor([[5.0, -5.0, 1.0, 1.0, 0.8, 0.8, -3.0, -3.0]])
    ids, weights = impl.route_sigmoid_grouped(logits, 2, torch.zeros(8), 4, 2, 1.0)
    assert ids.tolist() == [[2, 3]]  # expert 0 is the best, but its group is not
    torch.testing.assert_close(weights, torch.tensor([[0.5, 0.5]]))


def routing(tokens: int, experts: int, k: int, g: torch.Generator, popular: int):
    """Each token's k distinct experts, drawn mostly among the first ``popular`` experts:
    some crowded, some idle."""
    bias = torch.zeros(experts)
    bias[:popular] = 4.0
    ids = torch.multinomial((bias + torch.rand(tokens, experts, generator=g)).softmax(-1),
                            k, replacement=False, generator=g)
    return ids, torch.rand(tokens, k, generator=g)


@st.composite
def dispatch_cases(draw):
    experts = draw(st.integers(1, 10))
    k = draw(st.integers(1, min(experts, 4)))
    tokens, hidden = draw(st.integers(1, 30)), draw(st.integers(1, 8))
    inter = draw(st.integers(1, 6))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    ids, weights = routing(tokens, experts, k, g, draw(st.integers(1, experts)))
    return (torch.randn(tokens, hidden, generator=g, dtype=torch.float64), ids, weights,
            torch.randn(experts, 2 * inter, hidden, generator=g, dtype=torch.float64),
            torch.randn(experts, hidden, inter, generator=g, dtype=torch.float64))


@pytest.mark.exercise("18.2", points=3)
@HIDDEN
@given(dispatch_cases())
def test_dispatch_matches_the_library(case):
    got = impl.grouped_expert_forward(*(t.clone() for t in case))
    assert got.shape == case[0].shape and got.dtype == torch.float64
    torch.testing.assert_close(got, moe.dispatch(*case), rtol=1e-10, atol=1e-10)


def token_loop(x, ids, weights, gate_up, down):
    """The oracle in float64: every token through each of its experts, one at a time."""
    inter = down.shape[-1]
    out = torch.zeros_like(x, dtype=torch.float64)
    for t in range(len(x)):
        for j, e in enumerate(ids[t].tolist()):
            v = x[t].double()
            h = F.silu(gate_up[e, :inter].double() @ v) * (gate_up[e, inter:].double() @ v)
            out[t] += weights[t, j].double() * (down[e].double() @ h)
    return out


@pytest.mark.exercise("18.2", points=1)
@pytest.mark.parametrize("tokens", [1, 2, 37])
def test_dispatch_in_float32_equals_a_loop_over_tokens(tokens):
    g = torch.Generator().manual_seed(tokens)
    ids, weights = routing(tokens, 6, 2, g, popular=2)
    x, gate_up, down = (torch.randn(*shape, generator=g) for shape in
                        ((tokens, 16), (6, 20, 16), (6, 16, 10)))
    got = impl.grouped_expert_forward(x, ids, weights, gate_up, down)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), token_loop(x, ids, weights, gate_up, down),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.exercise("18.2", points=1)
def test_an_expert_no_token_chose_is_never_read():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 8, generator=g, dtype=torch.float64)
    gate_up = torch.randn(6, 12, 8, generator=g, dtype=torch.float64)
    down = torch.randn(6, 8, 6, generator=g, dtype=torch.float64)
    ids = torch.tensor([[4, 1], [1, 4], [4, 1], [1, 4], [4, 1]])  # experts 0, 2, 3, 5 idle
    weights = torch.rand(5, 2, generator=g)
    expected = token_loop(x, ids, weights, gate_up, down)
    gate_up[[0, 2, 3, 5]], down[[0, 2, 3, 5]] = torch.nan, torch.nan
    got = impl.grouped_expert_forward(x, ids, weights, gate_up, down)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


def counted(tokens: int) -> OpCounter:
    g = torch.Generator().manual_seed(0)
    ids = torch.stack([torch.randperm(4, generator=g)[:2] for _ in range(tokens)])
    ids[:4] = torch.tensor([[0, 1], [2, 3], [1, 0], [3, 2]])  # all four experts active
    args = (torch.randn(tokens, 8, generator=g), ids, torch.rand(tokens, 2, generator=g),
            torch.randn(4, 12, 8, generator=g), torch.randn(4, 8, 6, generator=g))
    with OpCounter() as counter:
        impl.grouped_expert_forward(*args)
    return counter


@pytest.mark.exercise("18.2", points=2)
def test_the_work_is_per_expert_not_per_token():
    few, many = counted(6), counted(60)
    assert many.products() <= 2 * 4, f"{many.products()} products for 4 active experts"
    assert sum(many.ops.values()) <= sum(few.ops.values()) + 8, (
        f"{sum(few.ops.values())} operators for 6 tokens but {sum(many.ops.values())} for "
        "60: the work grows with the tokens (a loop over tokens?)")


@pytest.fixture
def one_thread():
    """Run on one thread: the many small per-expert products of SmolLM2's sliced MLPs do
    not gain from a second, and on a busy machine each waits for the other thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.exercise("18.2", points=2)
@pytest.mark.timeout(300)  # SmolLM2 three times through the engine, eagerly
def test_smollm2_with_your_moe_layers_in_the_engine(smollm2, tokenizer, one_thread):
    """Every MLP of SmolLM2 cut into 8 experts: all 8 active with weight 1 is the dense
    model (your tokens equal its tokens); 4 of 8 is a different model (your tokens equal
    the library's)."""
    prompts = [tokenizer.encode("The capital of France is"),
               tokenizer.encode("Three primary colours are")]  # short: prefill is cheap
    params = SamplingParams(max_tokens=6, temperature=0)

    def tokens(model):
        outputs = LLM(model, tokenizer=tokenizer, executor="eager", num_blocks=32).generate(
            prompts, params, progress=False)
        assert all(output.error is None for output in outputs)
        return [output.tokens for output in outputs]

    assert tokens(impl.moefied(smollm2, 8, 8)) == tokens(smollm2)
    assert tokens(impl.moefied(smollm2, 8, 4)) == tokens(impl.library_moefied(smollm2, 8, 4))
