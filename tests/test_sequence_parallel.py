"""Sequence parallelism over gloo processes: logits equal tensor parallelism alone and one
process, the norm gradients summed over ranks equal one process's (so g and ḡ have the
right backward), each forward swaps every all-reduce for a reduce-scatter plus an
all-gather along the sequence, the activations kept for backward shrink, and sequences that
do not split (uneven length, a KV-cache decode step) are refused before any collective.
``sequence_parallel`` returns a new model whose regions are modules (no hooks) and leaves
the tensor-parallel model it was given as it was."""

from __future__ import annotations

import pytest
import torch
from test_tensor_parallel import changes, hooked, model_state

from minillm.checkpoint import load_model
from minillm.config import ModelConfig
from minillm.kv_cache import KVCache
from minillm.parallel import COLLECTIVES, tensor_parallel
from minillm.parallel.launch import run_ranks
from minillm.parallel.layers import RowParallelLinear, VocabParallelEmbedding, all_reduce
from minillm.parallel.sequence import (
    GatheredHead,
    SequenceParallel,
    SequenceParallelRegion,
    activation_bytes,
    sequence_parallel,
)
from minillm.testing import TINY, tiny_pair, varied_random_model

TOKENS = [[5, 17, 99, 3, 42, 7, 8, 5, 11, 64, 2, 30], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]]


def norm_gradients(model, tokens, seed=0):
    """Gradients of every RMSNorm weight for a loss that weighs the final norm's output (this
    rank's tokens of it under sequence parallelism) by fixed random numbers."""
    outputs = []
    inner = model.model if isinstance(model, SequenceParallel) else model
    hook = inner.norm.register_forward_hook(lambda module, args, output: outputs.append(output))
    try:  # the test's own probe, removed once it has seen the forward
        model(tokens)
    finally:
        hook.remove()
    weights = torch.randn(*tokens.shape, inner.norm.weight.shape[0],
                          generator=torch.Generator().manual_seed(seed))
    start = outputs[0].shape[1] * torch.distributed.get_rank() \
        if torch.distributed.is_initialized() else 0
    (outputs[0] * weights[:, start:start + outputs[0].shape[1]]).sum().backward()
    return {name: p.grad for name, p in inner.named_parameters() if "norm" in name}


def refusal(model, *args, **kwargs):
    """The error a call raises, and how many collectives ran before it."""
    COLLECTIVES.clear()
    try:
        model(*args, **kwargs)
    except ValueError as error:
        return str(error), sum(COLLECTIVES.values())
    return None, sum(COLLECTIVES.values())


def compare_forwards(rank, world, checkpoint, tokens, shard_attention):
    """On each rank: tensor parallelism alone and with sequence parallelism, side by side."""
    tokens = torch.tensor(tokens)
    tp = tensor_parallel(load_model(checkpoint), shard_attention=shard_attention)
    before = model_state(tp)
    sp = sequence_parallel(tp)  # from the same tp model, which stays tensor-parallel
    with torch.no_grad():
        COLLECTIVES.clear()
        tp_logits = tp(tokens)
        tp_counts = dict(COLLECTIVES)
        COLLECTIVES.clear()
        sp_logits = sp(tokens)
        counts = dict(COLLECTIVES)
    cache = KVCache(sp.config, tokens.shape[0], 32)
    return {"tp": tp_logits, "sp": sp_logits, "collectives": counts,
            "tp_collectives": tp_counts, "tp_changes": changes(tp, before),
            "hooks": hooked(tp) + hooked(sp),
            "activations": {"tp": activation_bytes(tp, tokens),
                            "sp": activation_bytes(sp, tokens)},
            "norm_gradients": norm_gradients(sp, tokens),
            "uneven": refusal(sp, tokens[:, :world + 1]),
            "cache": refusal(sp, tokens, cache=cache),
            "last_only": refusal(sp, tokens, last_only=True)}


@pytest.mark.parametrize("shard_attention", [True, False])
def test_sequence_parallelism_equals_tensor_parallelism_and_one_process(tmp_path,
                                                                        shard_attention):
    world = 2  # 3 ranks in the SmolLM2 test below (4 take 20 s on two cores)
    model, _ = tiny_pair(tmp_path, num_heads=8, num_kv_heads=2, head_dim=8,
                         attention_bias=True)
    tokens = torch.tensor(TOKENS)
    with torch.no_grad():
        expected = model(tokens)
    expected_gradients = norm_gradients(model, tokens)
    layers = model.config.num_layers
    # the embedding's and ḡ after attention and the MLP; g before them and before the head
    # (attention kept whole still gathers its input but needs no reduce-scatter after it)
    scatters = 2 * layers + 1 if shard_attention else layers + 1
    counts = {"reduce_scatter": scatters, "all_gather_sequence": 2 * layers + 1,
              "all_gather": 1}
    tp_counts = {"all_reduce": (2 if shard_attention else 1) * layers + 1, "all_gather": 1}
    results = run_ranks(compare_forwards, world, str(tmp_path), TOKENS, shard_attention,
                        timeout=120)
    for rank in results:
        assert torch.allclose(rank["sp"], rank["tp"], atol=1e-5)
        assert torch.allclose(rank["sp"], expected, atol=1e-5)
        assert rank["collectives"] == counts
        assert rank["tp_collectives"] == tp_counts  # the tp model still all-reduces
        assert rank["tp_changes"] == [] and rank["hooks"] == []
        # 129 096 vs 160 056 bytes measured with attention sharded (0.81): the norms and
        # residual adds keep half the tokens, the projections' inputs stay whole
        assert rank["activations"]["sp"] < rank["activations"]["tp"]
        assert rank["uneven"][0].startswith(f"sequence parallelism over {world} ranks")
        assert "pad the prompt" in rank["uneven"][0] and rank["uneven"][1] == 0
        assert "KV cache" in rank["cache"][0] and rank["cache"][1] == 0
        assert "logits[:, -1:]" in rank["last_only"][0] and rank["last_only"][1] == 0
    for name, gradient in expected_gradients.items():
        summed = sum(rank["norm_gradients"][name] for rank in results)
        assert torch.allclose(summed, gradient, atol=1e-5), name


def sequence_parallel_logits(rank, world, checkpoint, tokens):
    model = sequence_parallel(tensor_parallel(load_model(checkpoint)))
    with torch.no_grad():
        return model(torch.tensor(tokens))


def test_smollm2_under_sequence_parallelism_over_three_ranks(smollm2):
    with torch.no_grad():
        expected = smollm2(torch.tensor(TOKENS))
    for logits in run_ranks(sequence_parallel_logits, 3, "smollm2", TOKENS, timeout=120):
        # fp32 partial sums added in another order over 30 layers (as tensor parallelism)
        assert (logits - expected).abs().max() < 5e-3
        assert torch.equal(logits.argmax(-1), expected.argmax(-1))


@pytest.mark.parametrize("shard_attention", [True, False])
def test_sequence_parallel_returns_regions_as_modules_and_leaves_the_tp_model_as_it_was(
        shard_attention):
    model = varied_random_model(ModelConfig(**TINY))
    tp = tensor_parallel(model, 0, 2, shard_attention=shard_attention)
    before, model_before = model_state(tp), model_state(model)
    sp = sequence_parallel(tp)  # builds without a process group: only its forward needs one
    assert changes(tp, before) == [] and changes(model, model_before) == []
    assert hooked(model) == hooked(tp) == hooked(sp) == []
    assert type(sp) is SequenceParallel and sp.model is not tp and sp.config == tp.config
    assert not set(map(id, sp.modules())) & set(map(id, tp.modules()))
    # the tp model keeps its all-reduces; the copy reduce-scatters instead
    assert type(tp.embed_tokens) is VocabParallelEmbedding
    assert tp.embed_tokens.reduce is all_reduce
    assert sp.model.embed_tokens.reduce is not all_reduce
    for block, tp_block in zip(sp.model.layers, tp.layers, strict=True):
        for region, whole in ((block.attn, tp_block.attn), (block.mlp, tp_block.mlp)):
            assert type(region) is SequenceParallelRegion and type(whole) is not \
                SequenceParallelRegion
            outputs = [layer for layer in region.module.children()
                       if isinstance(layer, RowParallelLinear)]
            assert region.replicated == (not outputs)
            assert all(layer.reduce is not all_reduce for layer in outputs)
        assert tp_block.mlp.down_proj.reduce is all_reduce
        if shard_attention:
            assert tp_block.attn.o_proj.reduce is all_reduce
    assert type(sp.model.lm_head) is GatheredHead and sp.model.lm_head.head is not tp.lm_head
    assert type(tp.lm_head) is not GatheredHead
    # sequence parallelism needs a tp model, and applies once
    with pytest.raises(ValueError, match="tensor_parallel\\(model\\) first"):
        sequence_parallel(model)
    with pytest.raises(ValueError, match="already sequence-parallel"):
        sequence_parallel(sp)
