"""The draft head itself (minillm.draft_head): it can never propose a token outside its
K, its training passes compute exactly what serving computes (pass 1 with the target's
features, pass 2 with its own), it saves and loads to the same numbers, it refuses a
target it was not made for, and training lowers the held-out loss."""

from __future__ import annotations

import pytest
import torch

from minillm.config import ModelConfig
from minillm.draft_head import DraftHead, load_head, save_head
from minillm.draft_head.features import teacher_answers
from minillm.draft_head.train import TrainConfig, evaluate, make_batch, train_head, unrolled_mask
from minillm.draft_head.vocab import coverage, frequent_tokens, token_counts
from minillm.sampling import SamplingParams
from minillm.testing import TINY, varied_random_model

CONFIG = ModelConfig(**TINY)


@pytest.fixture(scope="module")
def target():
    return varied_random_model(CONFIG)


@pytest.fixture(scope="module")
def answers(target):
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 256, (5,), generator=generator).tolist() for _ in range(8)]
    replies = [torch.randint(0, 256, (14,), generator=generator).tolist() for _ in range(8)]
    return teacher_answers(target, prompts, replies, progress=False)


def random_head(target, k=64, seed=0):
    torch.manual_seed(seed)
    head = DraftHead.from_target(target, torch.randperm(CONFIG.vocab_size)[:k])
    for p in head.parameters():  # far from the target: its guesses are arbitrary
        p.data += 0.5 * torch.randn_like(p)
    return head.eval()


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=1.0),
                                    SamplingParams(temperature=0.7, top_k=5, top_p=0.9)])
def test_the_proposal_is_zero_outside_the_k_and_its_argmax_inside(target, params):
    head = random_head(target)
    outside = torch.ones(CONFIG.vocab_size, dtype=torch.bool)
    outside[head.vocab] = False
    for seed in range(20):
        logits = torch.randn(head.num_tokens, generator=torch.Generator().manual_seed(seed))
        probs = head.proposal(logits * 5, params)
        assert probs.shape == (CONFIG.vocab_size,)
        assert float(probs[outside].abs().max()) == 0.0
        assert float(probs.sum()) == pytest.approx(1.0, abs=1e-5)
        assert not outside[probs.argmax()]
        torch.testing.assert_close(probs[head.vocab],  # the K logits' own softmax, mapped
                                   torch.softmax(logits * 5, -1) if params.temperature == 1.0
                                   else probs[head.vocab])


def test_training_passes_compute_what_serving_computes(target, answers):
    """Pass 1 (target features) and pass 2 (the head's own feature from pass 1) of the
    unrolled training equal the serving path, head.extend, position by position."""
    head = random_head(target)
    batch = make_batch(answers[:1], 100)
    embeddings = target.embed_tokens(batch.tokens[0]).float()
    length = batch.tokens.shape[1]
    with torch.no_grad():
        x, q, k, v = head.project(batch.features[:, :-1], embeddings[None], batch.positions)
        g1 = head.finish(x, q, k, v, unrolled_mask(length, 1))[0]
        served, _ = head.extend(batch.features[0, :-1], embeddings, batch.positions[0], None)
        torch.testing.assert_close(g1, served, atol=1e-4, rtol=1e-4)
        fed_back = torch.cat([torch.zeros_like(g1[:1]), g1[:-1]])[None]
        x2, q2, k2, v2 = head.project(fed_back, embeddings[None], batch.positions)
        g2 = head.finish(x2, q2, torch.cat([k, k2], -2), torch.cat([v, v2], -2),
                         unrolled_mask(length, 2))[0]
        for t in range(1, length):  # a chain from position t - 1: real keys, then one guess
            _, past = head.extend(batch.features[0, :t], embeddings[:t], batch.positions[0, :t],
                                  None)
            guess, _ = head.extend(g1[t - 1][None], embeddings[t:t + 1],
                                   batch.positions[0, t:t + 1], past)
            torch.testing.assert_close(g2[t], guess[0], atol=1e-3, rtol=1e-3)


def test_save_and_load_give_the_same_head(target, tmp_path):
    head = random_head(target)
    save_head(head, tmp_path, {"steps": 0})
    loaded = load_head(tmp_path)
    torch.testing.assert_close(loaded.vocab, head.vocab)
    for (name, mine), (_, theirs) in zip(head.state_dict().items(),
                                         loaded.state_dict().items(), strict=True):
        torch.testing.assert_close(mine, theirs, msg=name)
    with pytest.raises(FileNotFoundError, match="train-draft-head"):
        load_head(tmp_path / "nothing")


def test_a_head_for_another_model_is_refused(target):
    head = random_head(target)
    wider = varied_random_model(ModelConfig(**{**TINY, "hidden_size": 128}))
    with pytest.raises(ValueError, match="hidden_size 64 vs the target's 128"):
        head.check_target(wider)
    larger = varied_random_model(ModelConfig(**{**TINY, "vocab_size": 300}))
    with pytest.raises(ValueError, match="vocab_size"):
        head.check_target(larger)
    with pytest.raises(ValueError, match="outside"):
        DraftHead(CONFIG, torch.tensor([0, 256]))
    with pytest.raises(ValueError, match="twice"):
        DraftHead(CONFIG, torch.tensor([3, 3]))


def test_training_lowers_the_held_out_loss(target, answers):
    head = DraftHead.from_target(target, torch.arange(0, 256, 2))
    before = evaluate(head, target, answers[6:], depth=2)["loss"]
    train_head(head, target, answers[:6], TrainConfig(steps=12, batch_size=3, depth=2,
                                                      lr=3e-3), progress=False)
    assert evaluate(head, target, answers[6:], depth=2)["loss"] < before


def test_frequent_tokens_and_coverage():
    counts = token_counts([[5, 5, 5, 7, 7, 9]], 12)
    fallback = torch.arange(12)  # ties among the unseen: larger id first here
    assert frequent_tokens(counts, 2).tolist() == [5, 7]
    assert frequent_tokens(counts, 4, fallback).tolist() == [5, 7, 9, 11]
    assert coverage(torch.tensor([5, 7]), torch.tensor([5, 7, 9, 5])) == 0.75
    with pytest.raises(ValueError, match="K must be"):
        frequent_tokens(counts, 13)
