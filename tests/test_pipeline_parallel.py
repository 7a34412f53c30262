"""Pipeline parallelism: the simulated GPipe bubble is (p-1)/(m+p-1), 1F1B has the same
bubble but holds at most p micro-batches instead of m, the slowest stage sets the pace;
pipelined logits over gloo processes equal one process's (1e-5 on tiny models, uneven
splits and tied embeddings included; SmolLM2 to 1e-4), and bad splits are refused. A
stage is made of the model's weights and leaves the model as it was."""

from __future__ import annotations

import pytest
import torch
from test_tensor_parallel import changes, hooked, model_state

from minillm.checkpoint import load_model
from minillm.config import ModelConfig
from minillm.parallel.launch import run_ranks
from minillm.parallel.pipeline import (
    bubble_fraction,
    gpipe_bubble,
    measured_bubble,
    peak_in_flight,
    pipeline_forward,
    pipeline_stage,
    schedule,
    stage_layers,
)
from minillm.testing import TINY, tiny_pair, varied_random_model

TOKENS = torch.tensor([[5, 17, 99, 3, 42, 7, 8, 5], [1, 2, 3, 4, 5, 6, 7, 8],
                       [9, 9, 8, 8, 7, 7, 6, 6], [200, 100, 50, 25, 12, 6, 3, 1]])
MICROBATCHES = (1, 2, 4)


# --- the cost model ----------------------------------------------------------------------


@pytest.mark.parametrize("stages, microbatches", [(2, 1), (2, 8), (4, 4), (4, 16), (8, 3)])
@pytest.mark.parametrize("backward_time", [0.0, 2.0])
def test_simulated_gpipe_bubble_is_the_formula(stages, microbatches, backward_time):
    events = schedule("gpipe", stages, microbatches, 1.0, backward_time)
    assert bubble_fraction(events) == pytest.approx(gpipe_bubble(stages, microbatches))
    assert gpipe_bubble(2, 1) == 0.5 and gpipe_bubble(4, 8) == 3 / 11


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
def test_schedules_honour_dependencies(kind):
    stages, microbatches = 4, 6
    events = schedule(kind, stages, microbatches, [1.0, 2.0, 1.5, 1.0], 2.0)
    end = {(e.stage, e.phase, e.microbatch): e.end for e in events}
    assert len(end) == 2 * stages * microbatches
    for e in events:
        if e.phase == "F" and e.stage > 0:
            assert e.start >= end[e.stage - 1, "F", e.microbatch]
        if e.phase == "B":
            source = e.stage + 1 if e.stage < stages - 1 else e.stage
            source_phase = "B" if e.stage < stages - 1 else "F"
            assert e.start >= end[source, source_phase, e.microbatch]
    for stage in range(stages):
        mine = sorted((e for e in events if e.stage == stage), key=lambda e: e.start)
        assert all(a.end <= b.start for a, b in zip(mine, mine[1:], strict=False))


def test_1f1b_order_has_warmup_steady_state_and_cooldown():
    events = schedule("1f1b", 4, 8, 1.0, 2.0)
    order = {s: "".join(e.phase for e in events if e.stage == s) for s in range(4)}
    assert order[0] == "FFF" + "FB" * 5 + "BBB"
    assert order[3] == "FB" * 8


def test_1f1b_has_gpipe_bubble_but_holds_at_most_p_microbatches():
    stages, microbatches = 4, 12
    gpipe = schedule("gpipe", stages, microbatches, 1.0, 2.0)
    one_f_one_b = schedule("1f1b", stages, microbatches, 1.0, 2.0)
    assert bubble_fraction(one_f_one_b) == pytest.approx(bubble_fraction(gpipe))
    for stage in range(stages):
        assert peak_in_flight(gpipe, stage) == microbatches
        assert peak_in_flight(one_f_one_b, stage) == stages - stage  # at most p
    with pytest.raises(ValueError, match="backward pass"):
        peak_in_flight(schedule("gpipe", stages, microbatches), 0)


def test_the_slowest_stage_sets_the_pace():
    times, microbatches = [1.0, 3.0, 1.0, 1.0], 8
    events = schedule("gpipe", 4, microbatches, times)
    assert max(e.end for e in events) == sum(times) + (microbatches - 1) * max(times)
    assert bubble_fraction(events) > gpipe_bubble(4, microbatches)


def test_bad_schedules_are_refused():
    with pytest.raises(ValueError, match="unknown pipeline schedule"):
        schedule("zigzag", 2, 4)
    with pytest.raises(ValueError, match="one per stage"):
        schedule("gpipe", 3, 4, [1.0, 2.0])


# --- pipelined inference ----------------------------------------------------------------


def test_layers_split_into_balanced_consecutive_runs():
    assert [stage_layers(5, r, 3) for r in range(3)] == [range(0, 2), range(2, 4), range(4, 5)]
    assert [len(stage_layers(30, r, 4)) for r in range(4)] == [8, 8, 7, 7]
    assert stage_layers(2, 0, 1) == range(0, 2)


def test_bad_splits_are_refused_with_what_to_do(tmp_path):
    model, _ = tiny_pair(tmp_path)  # 2 layers
    with pytest.raises(ValueError, match="cannot split 2 layers into 3.*at most 2"):
        pipeline_stage(model, 0, 3)
    with pytest.raises(ValueError, match="at least one stage"):
        pipeline_stage(model, 0, 0)
    stage = pipeline_stage(model, 0, 1)  # the check comes before any communication
    with pytest.raises(ValueError, match="4 sequences does not split into 3"):
        pipeline_forward(stage, TOKENS, 3)


@pytest.mark.parametrize("layers, tied", [(2, False), (5, True)])
def test_a_stage_leaves_the_model_as_it_was(layers, tied):
    model = varied_random_model(ModelConfig(**{**TINY, "num_layers": layers,
                                               "tie_word_embeddings": tied}))
    before = model_state(model)
    with torch.no_grad():
        logits = model(TOKENS)
    for world in range(1, layers + 1):
        stages = [pipeline_stage(model, rank, world) for rank in range(world)]
        assert changes(model, before) == [], world
        for stage in stages:
            assert stage.model is not model and hooked(stage) == []
            kept = stage_layers(layers, stage.rank, world)
            assert [layer.attn.layer_index for layer in stage.layers] == list(kept)
            # the stage's layers hold the model's own weights (no copy)
            for layer, index in zip(stage.layers, kept, strict=True):
                assert layer.attn.q_proj.weight is model.layers[index].attn.q_proj.weight
            assert (stage.embed_tokens is not None) == stage.is_first
            assert (stage.lm_head is not None) == stage.is_last
        assert len(model.layers) == layers and model.embed_tokens is not None
        assert model.norm is not None and model.lm_head is not None
    with torch.no_grad():  # and the model still computes what it did
        assert torch.equal(model(TOKENS), logits)


def pipelined_logits(rank, world, checkpoint, tokens, microbatch_counts):
    """On each rank: load, keep this rank's stage, run the pipeline for each micro-batch
    count; returns what the stage kept, the logits (last rank) and the timelines."""
    stage = pipeline_stage(load_model(checkpoint), rank, world)
    runs = {m: pipeline_forward(stage, tokens, m) for m in microbatch_counts}
    return {"layers": [layer.attn.layer_index for layer in stage.layers],
            "has_embedding": stage.embed_tokens is not None, "has_head": stage.lm_head is not None,
            "logits": {m: logits for m, (logits, _) in runs.items()},
            "timelines": {m: timeline for m, (_, timeline) in runs.items()}}


@pytest.fixture(scope="module", params=[(2, 2, False), (3, 5, True)],
                ids=["2 stages of 2 layers", "3 stages of 5 tied layers"])
def tiny_run(request, tmp_path_factory):
    """A tiny model's logits in one process, and every rank's result under the pipeline."""
    stages, layers, tied = request.param
    directory = tmp_path_factory.mktemp("tiny")
    model, _ = tiny_pair(directory, num_layers=layers, tie_word_embeddings=tied)
    with torch.no_grad():
        expected = model(TOKENS)
    return expected, run_ranks(pipelined_logits, stages, str(directory), TOKENS, MICROBATCHES,
                               timeout=120)


def test_pipelined_tiny_model_equals_one_process(tiny_run):
    expected, results = tiny_run
    stages = len(results)
    layers = [index for rank in results for index in rank["layers"]]
    assert layers == list(range(len(layers)))  # every layer once, in order
    assert [rank["has_embedding"] for rank in results] == [True] + [False] * (stages - 1)
    assert [rank["has_head"] for rank in results] == [False] * (stages - 1) + [True]
    for m in MICROBATCHES:
        assert all(rank["logits"][m] is None for rank in results[:-1])
        assert torch.allclose(results[-1]["logits"][m], expected, atol=1e-5), m


def test_measured_bubble_of_a_real_run(tiny_run):
    _, results = tiny_run
    for m in MICROBATCHES:
        timelines = [rank["timelines"][m] for rank in results]
        assert [len(timeline) for timeline in timelines] == [m] * len(results)
        bubble = measured_bubble(timelines)
        print(f"{len(results)} stages, {m} micro-batches: measured bubble {bubble:.2f}, "
              f"formula {gpipe_bubble(len(results), m):.2f}")
        assert 0 < bubble < 1  # wall-clock: reported, not compared


@pytest.mark.smollm2
def test_smollm2_over_two_stages_equals_one_process(smollm2):
    tokens = TOKENS[:2]
    with torch.no_grad():
        expected = smollm2(tokens)
    results = run_ranks(pipelined_logits, 2, "smollm2", tokens, (2,), timeout=120)
    assert [len(rank["layers"]) for rank in results] == [15, 15]
    assert results[0]["logits"][2] is None
    assert torch.allclose(results[1]["logits"][2], expected, atol=1e-4)
