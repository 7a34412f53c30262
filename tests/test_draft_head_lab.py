"""Chapter 11's draft-head lab helper (minillm.experiments.draft_head_lab): on a tiny model
the two fresh heads are the same head, training them with the library's step gives the
same curves, and decoding with a head is lossless and counts τ; on SmolLM2 the whole lab
runs with nothing cached (it builds its own self-distillation data) and prints nothing
that depends on the machine unless asked."""

from __future__ import annotations

import pytest
import torch

from minillm.config import ModelConfig
from minillm.draft_head.features import teacher_answers
from minillm.draft_head.train import TrainConfig, train_head, train_step
from minillm.experiments import draft_head_lab as lab
from minillm.reference import generate
from minillm.sampling import SamplingParams
from minillm.testing import TINY, varied_random_model


@pytest.fixture(scope="module")
def target():
    return varied_random_model(ModelConfig(**TINY))


@pytest.fixture(scope="module")
def data(target):
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 256, (4,), generator=g).tolist() for _ in range(6)]
    replies = [torch.randint(0, 256, (10,), generator=g).tolist() for _ in range(6)]
    return {"train": teacher_answers(target, prompts, replies, progress=False),
            "corpus_counts": torch.arange(256)}


def test_the_twins_train_alike(target, data, capsys):
    heads = lab.fresh_heads(target, data, k=32)
    for (name, a), (_, b) in zip(heads[0].state_dict().items(), heads[1].state_dict().items(),
                                 strict=True):
        assert torch.equal(a, b), name
    config = TrainConfig(steps=3, batch_size=2, depth=2, lr=1e-3, max_len=8)
    losses = {name: train_head(head, target, data["train"], config, progress=False)
              for name, head in zip(("yours", "library"), heads, strict=True)}
    assert lab.print_curves(losses) == 0.0
    assert "the curves agree within 1e-04: True" in capsys.readouterr().out


def test_decoding_with_a_head_is_lossless(target, data):
    head = lab.fresh_heads(target, data, k=128)[0].eval()
    prompts = [[1, 2, 3, 4, 1, 2, 3, 4], [9, 8, 7]]
    drafted = lab.decode(target, None, prompts, 12, head)
    assert drafted.tokens == [generate(target, p, 12, SamplingParams())[0] for p in prompts]
    assert drafted.tau >= 1.0
    assert lab.decode(target, None, prompts, 12).tau == 1.0  # no head: one token a pass


def test_the_lab_runs_on_smollm2_with_nothing_cached(smollm2, tokenizer, capsys):
    result = lab.train_beside_library(train_step, smollm2, tokenizer)
    printed = capsys.readouterr().out
    assert "12 answers to train on, 2 held out, at most 32 tokens each" in printed
    assert result["gap"] == 0.0  # the library's step beside itself
    assert result["held_out"][1] < result["held_out"][0]  # training helped
    assert "same tokens as plain decoding: True" in printed and result["tau"] >= 1.0
    assert "seconds" not in printed and set(result["seconds"]) == {"data", "yours", "library",
                                                                    "serving"}
