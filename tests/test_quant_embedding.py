"""Compact embeddings: fp16 / int8 storage, tied lm_head, measured bytes."""

from __future__ import annotations

import copy

import pytest
import torch

from minillm.generate import generate
from minillm.quant.embedding import CompactEmbedding, TiedLMHead, compact_embedding
from minillm.quant.qlinear import model_nbytes
from minillm.testing import tiny_pair


def test_int8_rows_are_within_half_a_step_of_the_original():
    weight = torch.randn(50, 32, generator=torch.Generator().manual_seed(0))
    embedding = CompactEmbedding(weight, "int8")
    assert embedding.table.dtype == torch.int8 and embedding.scales.shape == (50, 1)
    step = weight.abs().amax(dim=1, keepdim=True) / 127
    # half a step, plus up to 127 codes times the fp16 rounding of the step (2^-11 relative)
    bound = step * (0.5 + 127 * 2**-11)
    assert ((embedding.dense_weight() - weight).abs() <= bound).all()
    ids = torch.tensor([[3, 49, 0]])
    torch.testing.assert_close(embedding(ids), embedding.dense_weight()[ids])


def test_fp16_table_is_the_rounded_weight():
    weight = torch.randn(10, 8, generator=torch.Generator().manual_seed(1))
    embedding = CompactEmbedding(weight, "fp16")
    assert embedding.table.dtype == torch.float16
    torch.testing.assert_close(embedding.dense_weight(), weight.half().float())


@pytest.mark.parametrize("fmt, ratio", [("fp16", 0.5), ("int8", 0.27)])
def test_tied_model_shares_one_compact_table(tmp_path, fmt, ratio):
    model, _ = tiny_pair(tmp_path, tie_word_embeddings=True)
    table_bytes = model.embed_tokens.weight.nbytes
    before = model_nbytes(model)
    compact = compact_embedding(copy.deepcopy(model), fmt)
    assert isinstance(compact.lm_head, TiedLMHead)
    assert compact.lm_head.embedding is compact.embed_tokens
    saved = before - model_nbytes(compact)
    assert saved >= (1 - ratio) * table_bytes  # the table is counted once, compactly
    ids = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(compact(ids), model(ids), atol=0.05, rtol=0.05)
    assert len(generate(compact, [1, 2, 3], 4)[0]) == 4


def test_untied_lm_head_is_left_alone(tmp_path):
    model, _ = tiny_pair(tmp_path)  # TINY has untied embeddings
    head = model.lm_head
    assert compact_embedding(model, "int8").lm_head is head


def test_unknown_format_is_a_clear_error():
    with pytest.raises(ValueError, match="fp16, int8"):
        CompactEmbedding(torch.zeros(2, 2), "int4")
