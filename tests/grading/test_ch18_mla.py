"""Graded tests for chapter 18's MLA lab. The library (:mod:`minillm.mla`) is the oracle; the
expanded form (every head's keys and values built) is the definition."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minillm.grading import load_impl
from minillm.mla import LatentAttention, LatentShape

impl = load_impl("ch18_mla")


def _layer(shape: LatentShape, seed: int) -> LatentAttention:
    torch.manual_seed(seed)
    return LatentAttention(16, shape).double()


def _case(seqs, heads, slots, rank, nope, rope, v_dim, seed):
    g = torch.Generator().manual_seed(seed)
    def draw(*size):
        return torch.randn(*size, generator=g, dtype=torch.float64)
    lens = torch.randint(1, slots + 1, (seqs,), generator=g)
    return dict(q_nope=draw(seqs, heads, nope), q_rot=draw(seqs, heads, rope),
                latents=draw(seqs, slots, rank), rope_keys=draw(seqs, slots, rope),
                context_lens=lens, w_uk=draw(heads, nope, rank), w_uv=draw(heads, v_dim, rank),
                scale=(nope + rope) ** -0.5)


def _expanded_reference(case):
    """The definition: expand keys and values for every head, attend over each length."""
    out = []
    for s, length in enumerate(case["context_lens"].tolist()):
        c, k_rot = case["latents"][s, :length], case["rope_keys"][s, :length]
        k_nope = torch.einsum("hdr,tr->htd", case["w_uk"], c)
        values = torch.einsum("hvr,tr->htv", case["w_uv"], c)
        scores = (torch.einsum("hd,htd->ht", case["q_nope"][s], k_nope)
                  + case["q_rot"][s] @ k_rot.T) * case["scale"]
        out.append(torch.einsum("ht,htv->hv", scores.softmax(-1), values))
    return torch.stack(out)


@pytest.mark.exercise("18.4", points=1)
@pytest.mark.parametrize("heads, nope, v_dim", [(1, 4, 4), (3, 6, 5), (4, 8, 2)])
def test_split_matches_the_library(heads, nope, v_dim):
    shape = LatentShape(num_heads=heads, kv_lora_rank=7, qk_nope_head_dim=nope,
                        qk_rope_head_dim=2, v_head_dim=v_dim)
    layer = _layer(shape, heads)
    w_uk, w_uv = impl.split_up_projection(layer.kv_b_proj.weight.detach(), heads, nope, v_dim)
    expected_uk, expected_uv = layer.up_projections()
    torch.testing.assert_close(w_uk, expected_uk.detach())
    torch.testing.assert_close(w_uv, expected_uv.detach())


@pytest.mark.exercise("18.4", points=1)
def test_split_refuses_a_weight_of_the_wrong_size():
    with pytest.raises(ValueError):
        impl.split_up_projection(torch.zeros(3 * (4 + 5) + 1, 7), 3, 4, 5)


@pytest.mark.exercise("18.5", points=2)
@settings(max_examples=25, deadline=None)
@given(seqs=st.integers(1, 4), heads=st.integers(1, 4), slots=st.integers(1, 9),
       rank=st.integers(1, 12), nope=st.integers(1, 6), rope=st.sampled_from([2, 4]),
       v_dim=st.integers(1, 5), seed=st.integers(0, 2**16))
def test_absorbed_decode_equals_the_expanded_definition(seqs, heads, slots, rank, nope, rope,
                                                        v_dim, seed):
    case = _case(seqs, heads, slots, rank, nope, rope, v_dim, seed)
    out = impl.absorbed_decode(**case)
    assert out.shape == (seqs, heads, v_dim) and out.dtype == torch.float64
    torch.testing.assert_close(out, _expanded_reference(case))


@pytest.mark.exercise("18.5", points=1)
def test_garbage_past_the_length_is_never_read():
    case = _case(3, 2, 8, 6, 4, 2, 3, seed=5)
    case["context_lens"] = torch.tensor([1, 8, 3])
    expected = impl.absorbed_decode(**case)
    for name in ("latents", "rope_keys"):
        case[name] = case[name].clone()
        case[name][0, 1:] = 1e3
        case[name][2, 3:] = -1e3
    torch.testing.assert_close(impl.absorbed_decode(**case), expected)


@pytest.mark.exercise("18.5", points=1)
def test_matches_the_library_layer_on_its_own_cache():
    """The learner's decode, fed the library layer's weights and latents, gives the layer's
    output (before o_proj) for the last token of each sequence."""
    shape = LatentShape(num_heads=3, kv_lora_rank=10, qk_nope_head_dim=6, qk_rope_head_dim=4,
                        v_head_dim=5, q_lora_rank=8)
    layer = _layer(shape, 7)
    x = torch.randn(2, 6, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    angles = torch.outer(torch.arange(6.0), torch.tensor([1.0, 0.1])).repeat(1, 2)
    cos, sin = angles.cos()[None, None].double(), angles.sin()[None, None].double()
    with torch.no_grad():
        q_nope, q_rot = layer.queries(x, cos, sin)
        c, k_rot = layer.latents(x, cos, sin)
        expected = layer.attend_absorbed(q_nope[:, :, -1:], q_rot[:, :, -1:], c, k_rot, None)
        w_uk, w_uv = impl.split_up_projection(layer.kv_b_proj.weight, 3, 6, 5)
        out = impl.absorbed_decode(q_nope[:, :, -1], q_rot[:, :, -1], c, k_rot,
                                   torch.tensor([6, 6]), w_uk, w_uv, layer.softmax_scale)
    torch.testing.assert_close(out, expected[:, :, 0])
