"""Graded tests for chapter 10 (knowledge distillation).

Oracles: a float64 formula written out here, the library's ``kd_loss`` /
``sparse_kd_loss`` / ``divergence``, and the library's trainer run on a tiny random teacher.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from minillm import distill as library
from minillm.draft import layer_dropped
from minillm.grading import load_impl
from minillm.testing import tiny_pair

impl = load_impl("ch10_distillation")


def logits(*shape, seed=0, scale=3.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


def tokens(*shape, vocab, seed):
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


def float64_kd(student, teacher, targets, mask, alpha, t):
    s, te = student.double()[mask], teacher.double()[mask]
    p, log_q = torch.softmax(te / t, -1), torch.log_softmax(s / t, -1)
    kl = (p * (p.log() - log_q)).sum(-1)
    ce = -torch.log_softmax(s, -1).gather(-1, targets[mask][:, None])[:, 0]
    return float((alpha * t * t * kl + (1 - alpha) * ce).mean())


# -- 10.1 the KD loss -------------------------------------------------------------------

@pytest.mark.exercise("10.1", points=2)
@pytest.mark.parametrize("alpha, t", [(0.5, 2.0), (0.9, 4.0), (1.0, 1.0), (0.3, 0.5)])
def test_kd_loss_is_the_float64_formula(alpha, t):
    student, teacher = logits(2, 6, 20), logits(2, 6, 20, seed=1)
    targets = tokens(2, 6, vocab=20, seed=3)
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    got = impl.kd_loss(student, teacher, targets, mask, alpha, t)
    assert got.dtype == torch.float32 and got.dim() == 0
    assert float(got) == pytest.approx(float64_kd(student, teacher, targets, mask, alpha, t),
                                       rel=1e-5)


@pytest.mark.exercise("10.1", points=1)
def test_kd_loss_of_a_perfect_student_and_at_alpha_zero():
    teacher, mask = logits(2, 5, 30), torch.ones(2, 5, dtype=torch.bool)
    targets = tokens(2, 5, vocab=30, seed=4)
    assert float(impl.kd_loss(teacher.clone(), teacher, targets, mask, 1.0, 2.0)) == \
        pytest.approx(0.0, abs=1e-5)
    student = logits(2, 5, 30, seed=2)
    ce = F.cross_entropy(student.reshape(-1, 30), targets.reshape(-1))
    assert float(impl.kd_loss(student, teacher, targets, mask, 0.0, 2.0)) == \
        pytest.approx(float(ce), rel=1e-5)


@pytest.mark.exercise("10.1", points=1)
def test_kd_loss_ignores_padding_and_is_a_mean_per_token():
    student, teacher = logits(2, 6, 20), logits(2, 6, 20, seed=1)
    targets = tokens(2, 6, vocab=20, seed=3)
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[0, 2:] = False
    loss = impl.kd_loss(student, teacher, targets, mask, 0.5, 2.0)
    noisy = student.clone()
    noisy[0, 2:] += 50  # garbage where the mask says padding
    assert float(impl.kd_loss(noisy, teacher, targets, mask, 0.5, 2.0)) == pytest.approx(
        float(loss), rel=1e-6)
    assert float(loss) == pytest.approx(
        float(library.kd_loss(student, teacher, targets, mask, alpha=0.5, temperature=2.0)),
        rel=1e-5)


@pytest.mark.exercise("10.1", points=1)
def test_kd_loss_with_t_squared_keeps_soft_gradients_comparable():
    teacher = logits(4, 8, 100)
    base = teacher + logits(4, 8, 100, seed=5, scale=0.3)
    targets, mask = torch.zeros(4, 8, dtype=torch.long), torch.ones(4, 8, dtype=torch.bool)
    norms = []
    for t in (1.0, 2.0, 4.0):
        student = base.clone().requires_grad_(True)
        impl.kd_loss(student, teacher, targets, mask, 1.0, t).backward()
        norms.append(float(student.grad.norm()))
    assert max(norms) / min(norms) < 2.5  # the library: 2.2; without T², 35


# -- 10.2 the top-k loss the trainer uses -------------------------------------------------

@pytest.mark.exercise("10.2", points=2)
@pytest.mark.parametrize("alpha, t, k", [(0.9, 2.0, 8), (0.5, 1.0, 3), (0.0, 2.0, 8),
                                         (1.0, 4.0, 40)])
def test_sparse_kd_loss_matches_the_library(alpha, t, k):
    student, teacher = logits(2, 5, 40), logits(2, 5, 40, seed=1)
    top = teacher.topk(k, dim=-1)
    targets = tokens(2, 5, vocab=40, seed=6)
    got = impl.sparse_kd_loss(student, top.values, top.indices, targets, alpha=alpha,
                              temperature=t)
    expected = library.sparse_kd_loss(student, top.values, top.indices, targets, alpha=alpha,
                                      temperature=t)
    assert float(got) == pytest.approx(float(expected), rel=1e-5, abs=1e-6)


@pytest.mark.exercise("10.2", points=1)
def test_sparse_kd_loss_over_the_whole_vocabulary_is_the_full_loss():
    student, teacher = logits(2, 5, 30), logits(2, 5, 30, seed=1)
    top, targets = teacher.topk(30, dim=-1), tokens(2, 5, vocab=30, seed=2)
    mask = torch.ones(2, 5, dtype=torch.bool)
    got = impl.sparse_kd_loss(student, top.values, top.indices, targets, alpha=0.7,
                              temperature=2.0)
    assert float(got) == pytest.approx(float64_kd(student, teacher, targets, mask, 0.7, 2.0),
                                       rel=1e-5)


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    model, _ = tiny_pair(tmp_path_factory.mktemp("teacher"), num_layers=3)
    with torch.no_grad():
        model.lm_head.weight.mul_(6)  # confident predictions, as a trained model's
    return model


@pytest.mark.exercise("10.2", points=2)
def test_your_loss_trains_the_student_in_the_library_trainer(teacher):
    train = tokens(256, 48, vocab=256, seed=1)
    held_out = tokens(16, 48, vocab=256, seed=2)
    data = library.teacher_targets(teacher, train, k=32, batch_size=64, progress=False)
    best = library.teacher_targets(teacher, held_out, k=1, progress=False).indices
    config = library.DistillConfig(steps=40, batch_size=16, lr=1e-3)
    yours, theirs = layer_dropped(teacher, [0]), layer_dropped(teacher, [0])
    before = library.top1_agreement(yours, best, held_out)
    your_losses = library.distill(yours, data, config, progress=False, loss=impl.sparse_kd_loss)
    losses = library.distill(theirs, data, replace(config), progress=False)
    assert your_losses == pytest.approx(losses, rel=1e-3)
    assert library.top1_agreement(yours, best, held_out) > before


# -- 10.3 total variation -----------------------------------------------------------------

@pytest.mark.exercise("10.3", points=2)
@pytest.mark.parametrize("t", [1.0, 2.0, 0.5])
def test_total_variation_matches_the_library(t):
    p, q = logits(3, 4, 25), logits(3, 4, 25, seed=1)
    got = impl.total_variation(p, q, t)
    assert got.shape == (3, 4)
    assert torch.allclose(got, library.divergence(p, q, "tv", t), atol=1e-6)


@pytest.mark.exercise("10.3", points=1)
def test_total_variation_bounds_and_acceptance():
    p = logits(50, 10)
    assert torch.allclose(impl.total_variation(p, p.clone()), torch.zeros(50), atol=1e-6)
    far = torch.full((2, 10), -1e4)
    far[0, 0] = far[1, 1] = 1e4
    assert torch.allclose(impl.total_variation(far[:1], far[1:]), torch.ones(1))
    q = logits(50, 10, seed=1)
    overlap = torch.minimum(p.softmax(-1), q.softmax(-1)).sum(-1)  # the acceptance rate
    assert torch.allclose(1 - impl.total_variation(p, q), overlap, atol=1e-6)


# -- 10.4 greedy agreement ----------------------------------------------------------------

@pytest.mark.exercise("10.4", points=1)
def test_agreement_example_with_padding_and_ties():
    teacher = torch.tensor([[[0., 5, 1], [2, 2, 0], [9, 0, 0]],
                            [[1., 0, 0], [0, 0, 3], [0, 0, 0]]])
    student = torch.tensor([[[0., 6, 0], [1, 0, 0], [0, 9, 0]],
                            [[0., 1, 0], [0, 0, 1], [0, 0, 0]]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    # agree at (0,0), (0,1) (the tie picks index 0 on both sides) and (1,1): 3 of 5
    assert impl.greedy_agreement(student, teacher, mask) == pytest.approx(3 / 5)


@pytest.mark.exercise("10.4", points=1)
def test_agreement_pools_positions_and_matches_the_library(teacher):
    windows = tokens(6, 20, vocab=256, seed=9)
    student = layer_dropped(teacher, [0, 2])
    with torch.no_grad():
        s, t = student(windows), teacher(windows)
    full = torch.ones(6, 20, dtype=torch.bool)
    best = t.argmax(-1, keepdim=True)
    expected = library.top1_agreement(student, best, windows)
    assert impl.greedy_agreement(s, t, full) == pytest.approx(expected)
    ragged = full.clone()
    ragged[0, 2:] = False  # one short row must not weigh as much as a full one
    pooled = float((s.argmax(-1) == t.argmax(-1))[ragged].float().mean())
    assert impl.greedy_agreement(s, t, ragged) == pytest.approx(pooled)
