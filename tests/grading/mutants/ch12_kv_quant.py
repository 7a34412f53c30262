"""Plausible wrong answers to chapter 12, section 9 (int8 and KIVI int4 KV rounding); the
graded tests must catch each one. Each mutant replaces the solution function named before
its ``__``."""

import torch


def _solution():
    import solutions.ch12_kv_quant as solution

    return solution


def _round_half_away(x):
    return x.sign() * (x.abs() + 0.5).floor()


def _int8(x, scales):
    scaled = torch.where(scales[..., None] > 0, x / scales[..., None], 0.0)
    return scaled.round().clamp(-127, 127).to(torch.int8)


def quantize_int8__per_tensor_scale(x):
    """One scale for the whole tensor: a loud token or head coarsens every other one."""
    x = x.float()
    scales = (x.abs().amax() / 127).expand(x.shape[:-1]).contiguous()
    return _int8(x, scales), scales


def quantize_int8__round_half_away(x):
    """Rounds ties away from zero (C's round()), not to even like torch.round and the C++."""
    x = x.float()
    scales = x.abs().amax(-1) / 127
    scaled = torch.where(scales[..., None] > 0, x / scales[..., None], 0.0)
    return _round_half_away(scaled).clamp(-127, 127).to(torch.int8), scales


def quantize_int8__mean_abs_scale(x):
    """Scales by the mean |x| instead of the maximum: the large values are clipped."""
    x = x.float()
    scales = x.abs().mean(-1) / 127
    return _int8(x, scales), scales


def quantize_int8__range_128(x):
    """Divides the maximum by 128 (int8's -128 end): the largest value clips at 127."""
    x = x.float()
    scales = x.abs().amax(-1) / 128
    return _int8(x, scales), scales


def quantize_int8__epsilon_scale(x):
    """Guards the zero row by a floor on the maximum: tiny rows all round to zero."""
    x = x.float()
    scales = x.abs().amax(-1).clamp(min=1e-8) / 127
    return _int8(x, scales), scales


def quantize_int8__inverse_scale(x):
    """Returns 127 / max as the "scale" (what it multiplied by) instead of max / 127."""
    x = x.float()
    largest = x.abs().amax(-1)
    inverse = torch.where(largest > 0, 127 / largest, 0.0)
    return (x * inverse[..., None]).round().clamp(-127, 127).to(torch.int8), inverse


def dequantize_int8__divides(codes, scales):
    """Divides by the scale instead of multiplying: the rounding undone the wrong way."""
    return codes.float() / scales[..., None]


def dequantize_int8__scale_as_maximum(codes, scales):
    """Treats the scale as the row's maximum: code * scale / 127."""
    return codes.float() * scales[..., None] / 127


def quantize_int4__sixteen_levels(x, dim):
    """Divides the range by 16 (there are 16 codes), not 15 steps: the maximum clips."""
    x = x.float()
    low, high = x.amin(dim, keepdim=True), x.amax(dim, keepdim=True)
    scales = (high - low) / 16
    scaled = torch.where(scales > 0, (x - low) / scales, 0.0)
    return scaled.round().clamp(0, 15).to(torch.uint8), scales.squeeze(dim), low.squeeze(dim)


def quantize_int4__truncates(x, dim):
    """Casts (x - min) / scale to uint8 without rounding: every code rounds down."""
    x = x.float()
    low, high = x.amin(dim, keepdim=True), x.amax(dim, keepdim=True)
    scales = (high - low) / 15
    scaled = torch.where(scales > 0, (x - low) / scales, 0.0)
    return scaled.clamp(0, 15).to(torch.uint8), scales.squeeze(dim), low.squeeze(dim)


def quantize_int4__round_half_away(x, dim):
    """Rounds ties up (floor(v + 1/2)) instead of to even."""
    x = x.float()
    low, high = x.amin(dim, keepdim=True), x.amax(dim, keepdim=True)
    scales = (high - low) / 15
    scaled = torch.where(scales > 0, (x - low) / scales, 0.0)
    codes = _round_half_away(scaled).clamp(0, 15).to(torch.uint8)
    return codes, scales.squeeze(dim), low.squeeze(dim)


def quantize_int4__symmetric(x, dim):
    """Symmetric around zero (absmax / 7.5, minimum -absmax): half the grid is wasted on
    values a group never has."""
    x = x.float()
    largest = x.abs().amax(dim, keepdim=True)
    scales, low = 2 * largest / 15, -largest
    scaled = torch.where(scales > 0, (x - low) / scales, 0.0)
    return scaled.round().clamp(0, 15).to(torch.uint8), scales.squeeze(dim), low.squeeze(dim)


def quantize_int4__epsilon_scale(x, dim):
    """Guards the constant group with a floor on the range: its scale is not 0."""
    x = x.float()
    low, high = x.amin(dim, keepdim=True), x.amax(dim, keepdim=True)
    scales = (high - low).clamp(min=1e-8) / 15
    codes = ((x - low) / scales).round().clamp(0, 15).to(torch.uint8)
    return codes, scales.squeeze(dim), low.squeeze(dim)


def dequantize_int4__without_minimum(codes, scales, minimums, dim):
    """Forgets the zero point: code * scale, as if every group started at 0."""
    return codes.float() * scales.unsqueeze(dim)


def dequantize_int4__last_dim_statistics(codes, scales, minimums, dim):
    """Always puts the statistics back on the last dimension, right only for dim = -1."""
    return minimums[..., None] + codes.float() * scales[..., None]


def pack__high_nibble_first(codes):
    """Puts code 2i in the high four bits and 2i + 1 in the low four."""
    return (codes[..., 0::2] << 4) | codes[..., 1::2]


def pack__halves(codes):
    """Pairs code i with code i + n/2 (llama.cpp's q4_0 layout), not neighbours."""
    half = codes.shape[-1] // 2
    return codes[..., :half] | (codes[..., half:] << 4)


def unpack__concatenates(packed):
    """Puts all the low nibbles first, then all the high ones, instead of interleaving."""
    return torch.cat([packed & 0xF, packed >> 4], dim=-1)


def unpack__no_mask(packed):
    """Keeps the high bits in the low code: packed itself, not packed & 0xF."""
    return torch.stack([packed, packed >> 4], dim=-1).flatten(-2)


def quantize_kv_block__per_token_keys(keys, values):
    """Rounds keys per token like values (the mistake section 9 measures): an outlier
    channel takes every token's range, with its statistics laid out per token."""
    solution = _solution()
    key_codes, key_scales, key_minimums = solution.quantize_int4(keys, dim=-1)
    value_codes, value_scales, value_minimums = solution.quantize_int4(values, dim=-1)
    return solution.Int4Block(solution.pack(key_codes), key_scales, key_minimums,
                              solution.pack(value_codes), value_scales, value_minimums)


def quantize_kv_block__per_channel_values(keys, values):
    """Rounds values per channel too: a value can no longer be rounded when written."""
    solution = _solution()
    key_codes, key_scales, key_minimums = solution.quantize_int4(keys, dim=0)
    value_codes, value_scales, value_minimums = solution.quantize_int4(values, dim=0)
    return solution.Int4Block(solution.pack(key_codes), key_scales, key_minimums,
                              solution.pack(value_codes), value_scales, value_minimums)


def quantize_kv_block__unpacked(keys, values):
    """Stores one code a byte: twice the bytes, not the pool's layout."""
    solution = _solution()
    key_codes, key_scales, key_minimums = solution.quantize_int4(keys, dim=0)
    value_codes, value_scales, value_minimums = solution.quantize_int4(values, dim=-1)
    return solution.Int4Block(key_codes, key_scales, key_minimums,
                              value_codes, value_scales, value_minimums)


def dequantize_kv_block__keys_along_channels(block):
    """Undoes the keys along the channels (dim -1), like the values: their statistics are
    per channel, over the block's tokens (dim 0)."""
    solution = _solution()
    keys = solution.dequantize_int4(solution.unpack(block.key_codes), block.key_scales,
                                    block.key_minimums, -1)
    values = solution.dequantize_int4(solution.unpack(block.value_codes), block.value_scales,
                                      block.value_minimums, -1)
    return keys, values


def dequantize_kv_block__codes_not_unpacked(block):
    """Reads the packed bytes as if they were codes, forgetting unpack."""
    solution = _solution()
    keys = solution.dequantize_int4(block.key_codes, block.key_scales, block.key_minimums, 0)
    values = solution.dequantize_int4(block.value_codes, block.value_scales,
                                      block.value_minimums, -1)
    return keys, values
