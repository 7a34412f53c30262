"""Graded tests for chapter 11's draft-head lab (11.6-11.8): the head's loss over its K
tokens, the attention mask of a chain of guesses, one unrolled training step.

Oracles: the KL written out in float64 over the restricted, renormalised distribution
(Hypothesis draws the shapes, the K ids in any order and the masks); the library's
``unrolled_mask``, and the head's serving path (``DraftHead.extend``, guess by guess) for
what a pass computes; the library's ``train_step`` for the loss and the update (SGD, whose
update is the clipped gradient itself, with stale gradients left in the parameters; and
AdamW through ``train_head``) on hidden random tiny heads and padded batches; plain
``generate`` for a trained head in the engine.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minillm.config import ModelConfig
from minillm.draft_head import DraftHead
from minillm.draft_head import train as library
from minillm.draft_head.features import teacher_answers
from minillm.grading import load_impl
from minillm.reference import generate
from minillm.sampling import SamplingParams
from minillm.serve import LLM, SchedulerConfig
from minillm.testing import TINY, varied_random_model

impl = load_impl("ch11_draft_head")
CONFIG = ModelConfig(**TINY)


# -- 11.6 the loss over the K tokens --------------------------------------------------------

def kl_float64(target_logits, head_logits, vocab, valid) -> float:
    """KL(p_K || q) per position in float64, written out: p_K = p[vocab] / sum(p[vocab])."""
    p = torch.softmax(target_logits.double(), -1)[..., vocab]
    p = p / p.sum(-1, keepdim=True)
    q = torch.softmax(head_logits.double(), -1)
    kl = (p * (p.clamp_min(1e-300).log() - q.log())).sum(-1)
    return float(kl[valid].mean())


@st.composite
def loss_cases(draw):
    seed = draw(st.integers(0, 2**31 - 1))
    vocab_size = draw(st.integers(2, 60))
    k = draw(st.integers(1, vocab_size))
    shape = draw(st.sampled_from([(5,), (2, 7), (3, 1, 4)]))
    scale = draw(st.sampled_from([0.1, 1.0, 6.0]))
    g = torch.Generator().manual_seed(seed)
    valid = torch.rand(shape, generator=g) < 0.6
    valid.view(-1)[draw(st.integers(0, valid.numel() - 1))] = True
    return (scale * torch.randn(*shape, vocab_size, generator=g),
            scale * torch.randn(*shape, k, generator=g),
            torch.randperm(vocab_size, generator=g)[:k], valid)


@pytest.mark.exercise("11.6", points=3)
@settings(max_examples=50, deadline=None, derandomize=True, database=None)
@given(case=loss_cases())
def test_restricted_kl_matches_float64(case):
    target_logits, head_logits, vocab, valid = case
    got = impl.restricted_kl(target_logits, head_logits, vocab, valid)
    assert got.dim() == 0 and got.dtype == torch.float32
    assert float(got) == pytest.approx(kl_float64(*case), abs=1e-5, rel=1e-5)
    library_value = library.distillation_kl(target_logits[..., vocab], head_logits, valid)
    assert float(got) == pytest.approx(float(library_value), abs=1e-5, rel=1e-5)


@pytest.mark.exercise("11.6", points=1)
def test_the_mass_outside_the_k_is_dropped():
    """The target puts 0.9 of its mass on token 0, outside the head's K = {3, 1}: the head
    that matches the target's preference inside the K has loss 0."""
    target_logits = torch.log(torch.tensor([[0.9, 0.02, 0.05, 0.03]]))
    vocab = torch.tensor([3, 1])
    perfect = torch.log(torch.tensor([[0.6, 0.4]]))  # 0.03 : 0.02, renormalised
    valid = torch.tensor([True])
    assert float(impl.restricted_kl(target_logits, perfect, vocab, valid)) == \
        pytest.approx(0.0, abs=1e-6)
    swapped = perfect.flip(-1)  # the ids in the other order: a different distribution
    assert float(impl.restricted_kl(target_logits, swapped, vocab, valid)) == \
        pytest.approx(0.2 * math.log(1.5), abs=1e-5)


@pytest.mark.exercise("11.6", points=1)
def test_the_gradient_and_the_masked_positions():
    """d loss / d head_logits = (q - p_K) / (valid positions) at the valid positions and 0
    elsewhere; what the invalid positions hold changes nothing."""
    g = torch.Generator().manual_seed(2)
    target_logits = 3 * torch.randn(4, 6, 40, generator=g)
    vocab = torch.randperm(40, generator=g)[:9]
    valid = torch.rand(4, 6, generator=g) < 0.5
    head_logits = (3 * torch.randn(4, 6, 9, generator=g)).requires_grad_()
    impl.restricted_kl(target_logits, head_logits, vocab, valid).backward()
    p = torch.softmax(target_logits[..., vocab], -1)
    expected = (torch.softmax(head_logits.detach(), -1) - p) * valid[..., None] / valid.sum()
    torch.testing.assert_close(head_logits.grad, expected, atol=1e-6, rtol=1e-5)
    noisy = head_logits.detach().clone()
    noisy[~valid] = 1e4 * torch.randn(int((~valid).sum()), 9, generator=g)
    assert float(impl.restricted_kl(target_logits, noisy, vocab, valid)) == pytest.approx(
        float(impl.restricted_kl(target_logits, head_logits.detach(), vocab, valid)), rel=1e-6)


# -- 11.7 the mask of a chain of guesses ------------------------------------------------------

@pytest.mark.exercise("11.7", points=1)
def test_mask_example():
    # pass 2 over 4 indices: index t sees pass 1's keys 0..t-1, and its own key
    expected = torch.tensor([[0, 0, 0, 0, 1, 0, 0, 0],
                             [1, 0, 0, 0, 0, 1, 0, 0],
                             [1, 1, 0, 0, 0, 0, 1, 0],
                             [1, 1, 1, 0, 0, 0, 0, 1]], dtype=torch.bool)
    assert torch.equal(impl.unrolled_mask(4, 2), expected)
    assert torch.equal(impl.unrolled_mask(3, 1), torch.ones(3, 3, dtype=torch.bool).tril())


@pytest.mark.exercise("11.7", points=2)
@pytest.mark.parametrize("step", [1, 2, 3, 4, 5])
def test_mask_equals_the_library(step):
    for length in range(1, 13):
        got = impl.unrolled_mask(length, step)
        assert got.dtype == torch.bool and got.shape == (length, step * length)
        assert torch.equal(got, library.unrolled_mask(length, step)), length


@pytest.fixture(scope="module")
def target():
    return varied_random_model(CONFIG)


@pytest.fixture(scope="module")
def answers(target):
    """Ten answers of 6 to 17 tokens after prompts of 3 to 7 (batches get padding)."""
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(0, 256, (3 + i % 5,), generator=g).tolist() for i in range(10)]
    replies = [torch.randint(0, 256, (6 + (7 * i) % 12,), generator=g).tolist()
               for i in range(10)]
    return teacher_answers(target, prompts, replies, progress=False)


def hidden_head(target, seed, k=40):
    """A head started from the target, moved by noise, over ``k`` random ids (any order)."""
    torch.manual_seed(seed)
    head = DraftHead.from_target(target, torch.randperm(CONFIG.vocab_size)[:k])
    with torch.no_grad():
        for p in head.parameters():
            p += 0.2 * torch.randn_like(p)
    return head


@pytest.mark.exercise("11.7", points=2)
@pytest.mark.parametrize("depth", [2, 3])
def test_the_last_pass_computes_what_the_chain_of_guesses_computes(target, answers, depth):
    """Pass ``depth`` at index t, with your mask, equals serving: the head reads the
    target's features up to t - depth + 1, then guesses depth - 1 times in a row from its
    own outputs (``DraftHead.extend``)."""
    head = hidden_head(target, 3).eval()
    batch = library.make_batch(answers[1:2], 100)
    length = batch.tokens.shape[1]
    embeddings = target.embed_tokens(batch.tokens).float()
    with torch.no_grad():
        features, keys, values, outputs = batch.features[:, :-1], [], [], []
        for step in range(1, depth + 1):
            x, q, k, v = head.project(features, embeddings, batch.positions)
            keys, values = keys + [k], values + [v]
            g = head.finish(x, q, torch.cat(keys, -2), torch.cat(values, -2),
                            impl.unrolled_mask(length, step))[0]
            outputs.append(g)
            features = torch.cat([torch.zeros_like(g[:1]), g[:-1]])[None]
        for t in range(depth - 1, length):
            start = t - depth + 2  # the chain's first guess is at this index
            fed = slice(0, start)
            _, past = head.extend(batch.features[0, fed], embeddings[0, fed],
                                  batch.positions[0, fed], None)
            for j in range(1, depth):  # guess j reads pass j's output one index back
                index = start + j - 1
                guess, past = head.extend(outputs[j - 1][index - 1][None],
                                          embeddings[0, index:index + 1],
                                          batch.positions[0, index:index + 1], past)
            torch.testing.assert_close(outputs[-1][t], guess[0], atol=1e-3, rtol=1e-3)


# -- 11.8 one unrolled training step ---------------------------------------------------------

def one_step(step, head, target, batch, depth, stale_seed):
    """``step`` on a copy of ``head`` with SGD (lr 0.1: the update is the clipped gradient),
    stale gradients left in its parameters first. -> (loss, the copy)."""
    head = copy.deepcopy(head)
    g = torch.Generator().manual_seed(stale_seed)
    for p in head.parameters():
        p.grad = torch.randn(p.shape, generator=g)
    optimizer = torch.optim.SGD(head.parameters(), lr=0.1)
    return step(head, target, batch, optimizer, depth), head


def assert_same_heads(mine, theirs):
    for (name, a), (_, b) in zip(mine.named_parameters(), theirs.named_parameters(),
                                 strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.exercise("11.8", points=4)
@pytest.mark.parametrize("seed, depth, count, max_len", [
    (0, 1, 3, 16), (1, 2, 4, 16), (2, 3, 3, 12), (3, 3, 2, 9), (4, 4, 5, 17), (5, 2, 1, 7)])
def test_the_loss_and_the_update_equal_the_library(target, answers, seed, depth, count, max_len):
    head = hidden_head(target, 100 + seed)
    g = torch.Generator().manual_seed(seed)
    chosen = torch.randperm(len(answers), generator=g)[:count].tolist()
    batch = library.make_batch([answers[i] for i in chosen], max_len)
    loss, mine = one_step(impl.train_step, head, target, batch, depth, seed)
    expected, theirs = one_step(library.train_step, head, target, batch, depth, seed)
    assert isinstance(loss, float)
    assert loss == pytest.approx(expected, abs=1e-5, rel=1e-5)
    assert_same_heads(mine, theirs)


@pytest.mark.exercise("11.8", points=2)
def test_training_with_your_step_equals_the_library(target, answers):
    """Six AdamW steps with cosine decay through ``train_head(step=...)``: the same losses
    and the same head."""
    config = library.TrainConfig(steps=6, batch_size=3, depth=3, lr=3e-3, max_len=14, seed=7)
    heads = [hidden_head(target, 9) for _ in range(2)]
    mine = library.train_head(heads[0], target, answers, config, progress=False,
                              step=impl.train_step)
    theirs = library.train_head(heads[1], target, answers, config, progress=False)
    assert mine == pytest.approx(theirs, abs=1e-5, rel=1e-5)
    assert_same_heads(*heads)


@pytest.mark.exercise("11.8", points=1)
def test_the_target_stays_frozen(target, answers):
    frozen = copy.deepcopy(target)  # its parameters still require gradients
    before = {name: p.detach().clone() for name, p in frozen.named_parameters()}
    batch = library.make_batch(answers[:3], 16)
    one_step(impl.train_step, hidden_head(target, 5), frozen, batch, 3, 0)
    for name, p in frozen.named_parameters():
        assert p.grad is None, f"the target's {name} got a gradient"
        assert torch.equal(p.detach(), before[name]), name


@pytest.mark.exercise("11.8", points=1)
def test_a_head_trained_by_your_step_in_the_engine(target, answers):
    """Twelve of your steps lower the loss, and the engine with the trained head as its
    draft gives plain greedy decoding's tokens, with some guesses accepted."""
    head = DraftHead.from_target(target, torch.arange(0, 256, 2))
    config = library.TrainConfig(steps=12, batch_size=3, depth=2, lr=3e-3, max_len=16)
    losses = library.train_head(head, target, answers, config, progress=False,
                                step=impl.train_step)
    assert sum(losses[-3:]) < sum(losses[:3])
    prompts = [[1, 2, 3, 4, 1, 2, 3, 4], [9, 8, 7]]
    llm = LLM(target, block_size=4, num_blocks=64, draft_head=head,
              scheduler=SchedulerConfig(speculative_tokens=3, max_batch=2))
    outputs = llm.generate(prompts, SamplingParams(max_tokens=16), progress=False)
    assert [o.tokens for o in outputs] == [generate(target, p, 16)[0] for p in prompts]
    assert sum(o.outputs[0].drafted for o in outputs) > 0
