"""A draft head inside the engine (minillm.engine.head_proposer): greedy outputs equal
plain greedy decoding token for token (eager and native executors, alone and batched,
SmolLM2 too), sampled outputs keep the target's distribution, the hidden states the
runner hands the head are the target's, and bad configurations are refused."""

from __future__ import annotations

import pytest
import torch
from engine_driving import second_token_marginal, second_tokens_drawn

from minillm.config import ModelConfig
from minillm.draft_head import DraftHead
from minillm.draft_head.features import final_hidden
from minillm.engine.config import EngineConfig
from minillm.engine.head_proposer import DraftHeadProposer
from minillm.reference import generate
from minillm.sampling import SamplingParams
from minillm.serve import LLM, SchedulerConfig
from minillm.testing import TINY, varied_random_model

CONFIG = ModelConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_layers=2,
                     num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=256)
PROMPTS = [[1, 2, 3, 4, 1, 2, 3, 4, 1, 2], [5, 6, 7], [9] * 11, list(range(10, 30))]


@pytest.fixture(scope="module")
def model():
    return varied_random_model(CONFIG)


def head_for(model, k, seed=0, noise=0.0):
    """A head started from the target (it agrees with it often), over ``k`` random tokens,
    its weights moved by ``noise``."""
    torch.manual_seed(seed)
    vocab = torch.randperm(model.config.vocab_size)[:k]
    head = DraftHead.from_target(model, vocab)
    for p in head.parameters():
        p.data += noise * torch.randn_like(p)
    return head.eval()


def engine(model, head, gamma, **options):
    return LLM(model, block_size=4, num_blocks=128, draft_head=head,
               scheduler=SchedulerConfig(speculative_tokens=gamma,
                                         max_batch=options.pop("max_batch", 4)), **options)


@pytest.mark.parametrize("executor", ["eager", "native"])
def test_greedy_outputs_equal_plain_decoding(model, executor):
    params = SamplingParams(max_tokens=20)
    expected = [generate(model, p, 20, params)[0] for p in PROMPTS]
    drafted = accepted = 0
    cases = [(head_for(model, 32), 2, 4), (head_for(model, 12, seed=1, noise=0.3), 5, 1),
             (head_for(model, 12, seed=1, noise=0.3), 5, 4)]  # (head, γ, batch)
    for head, gamma, batch in cases:
        llm = engine(model, head, gamma, max_batch=batch, executor=executor)
        outputs = llm.generate(PROMPTS, params, progress=False)
        assert [o.tokens for o in outputs] == expected
        assert llm.free_blocks() == llm.blocks.num_blocks
        drafted += sum(o.outputs[0].drafted for o in outputs)
        accepted += sum(o.outputs[0].accepted for o in outputs)
    assert 0 < accepted < drafted  # guesses were both accepted and rejected


def test_the_head_reads_the_targets_hidden_states(model, monkeypatch):
    """Every feature the runner hands the head at a sequence's newest token (eager and
    native) is the dense model's final hidden state there."""
    seen = []
    observe = DraftHeadProposer.observe
    monkeypatch.setattr(DraftHeadProposer, "observe",
                        lambda self, hidden: (seen.append(hidden), observe(self, hidden))[1])
    for executor in ("eager", "native"):
        seen.clear()
        llm = engine(model, head_for(model, 32), 3, executor=executor)
        outputs = llm.generate(PROMPTS, SamplingParams(max_tokens=16), progress=False)
        first_id = min(seq_id for hidden in seen for seq_id in hidden)  # numbered in order
        dense = {first_id + i: final_hidden(model, prompt + o.tokens)
                 for i, (prompt, o) in enumerate(zip(PROMPTS, outputs, strict=True))}
        checked = 0
        for hidden in seen:
            for seq_id, (first, rows) in hidden.items():
                torch.testing.assert_close(rows[0], dense[seq_id][first], atol=1e-4, rtol=1e-4)
                checked += 1
        assert checked >= 4 * 5


def test_sampled_outputs_keep_the_targets_distribution(model):
    """2,500 seeded requests for 3 tokens at temperature 1, guessed by a head over half the
    vocabulary: the second token's empirical distribution is the exact marginal
    sum_t1 p(t1) p(t2 | t1) (sampling noise alone: TV ~0.04)."""
    prompt, params = list(range(1, 9)) * 2, SamplingParams(temperature=1.0)
    second = second_token_marginal(model, prompt, params)
    llm = LLM(model, block_size=16, num_blocks=2510, draft_head=head_for(model, 16, noise=0.3),
              scheduler=SchedulerConfig(max_batch=512, max_tokens_per_step=8192,
                                        speculative_tokens=1))
    drawn, samples = second_tokens_drawn(llm, prompt, 2500, CONFIG.vocab_size)
    assert sum(s.drafted for s in samples) > 2000
    assert 0.5 * float((drawn - second).abs().sum()) < 0.08


def test_smollm2_with_a_head_equals_plain_greedy(smollm2, tokenizer):
    prompts = [tokenizer.chat_prompt("Explain in one paragraph why the sea is salty."),
               tokenizer.chat_prompt("Give two tips for learning to cook.")]
    head = DraftHead.from_target(smollm2, torch.arange(4096))
    llm = LLM(smollm2, tokenizer=tokenizer, num_blocks=64, draft_head=head,
              scheduler=SchedulerConfig(max_batch=2, speculative_tokens=4))
    outputs = llm.generate(prompts, SamplingParams(max_tokens=12), progress=False)
    expected = [generate(smollm2, p, 12, stop_tokens=tokenizer.stop_tokens)[0] for p in prompts]
    assert [o.tokens for o in outputs] == expected
    assert sum(o.outputs[0].drafted for o in outputs) > 0


def test_bad_configurations_are_refused(model):
    head = head_for(model, 8)
    with pytest.raises(ValueError, match="speculative_tokens"):
        EngineConfig(draft_head=head)
    with pytest.raises(ValueError, match="not both"):
        EngineConfig(draft_head=head, draft_model=model,
                     scheduler=SchedulerConfig(speculative_tokens=2))
    with pytest.raises(ValueError, match="compiled"):
        EngineConfig(draft_head=head, executor="compiled",
                     scheduler=SchedulerConfig(speculative_tokens=2))
    other = varied_random_model(ModelConfig(**TINY))
    with pytest.raises(ValueError, match="made for another model"):
        LLM(other, draft_head=head, scheduler=SchedulerConfig(speculative_tokens=2))
