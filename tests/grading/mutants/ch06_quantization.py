"""Plausible wrong answers to chapter 06 (quantization basics); the graded tests must catch
each one. Each mutant replaces the solution function named before its ``__``."""

import torch


def absmax_quantize__full_int_range_clamp(x, bits, clip_ratio=1.0):
    """Clamps to [-2^(b-1), 2^(b-1) - 1], the int range, instead of the symmetric range."""
    q_max = 2 ** (bits - 1) - 1
    scale = (x.abs().max().float() * clip_ratio).clamp(min=1e-12) / q_max
    return torch.clamp(torch.round(x.float() / scale), -q_max - 1, q_max).to(torch.int8), scale


def absmax_quantize__no_zero_guard(x, bits, clip_ratio=1.0):
    """Divides by max|x| without the 1e-12 floor: an all-zero tensor gets Δ = 0 and 0/0."""
    q_max = 2 ** (bits - 1) - 1
    scale = x.abs().max().float() * clip_ratio / q_max
    return torch.clamp(torch.round(x.float() / scale), -q_max, q_max).to(torch.int8), scale


def absmax_quantize__signed_max(x, bits, clip_ratio=1.0):
    """Takes Δ from max x instead of max |x|."""
    q_max = 2 ** (bits - 1) - 1
    scale = (x.max().float() * clip_ratio).clamp(min=1e-12) / q_max
    return torch.clamp(torch.round(x.float() / scale), -q_max, q_max).to(torch.int8), scale


def absmax_quantize__divides_by_clip_ratio(x, bits, clip_ratio=1.0):
    """Widens the range by 1 / clip_ratio instead of shrinking it."""
    q_max = 2 ** (bits - 1) - 1
    scale = (x.abs().max().float() / clip_ratio).clamp(min=1e-12) / q_max
    return torch.clamp(torch.round(x.float() / scale), -q_max, q_max).to(torch.int8), scale


def absmax_dequantize__half(codes, scale):
    """Returns float16 instead of float32."""
    return codes.half() * scale.half()


def zeropoint_quantize__clamped_zero(x, bits, clip_ratio=1.0):
    """Clamps the zero point into [0, 2^b - 1]: an all-negative tensor loses its grid."""
    q_max = 2**bits - 1
    x = x.float()
    low, high = x.min() * clip_ratio, x.max() * clip_ratio
    scale = ((high - low) / q_max).clamp(min=1e-12)
    zero = torch.round(-low / scale).clamp(0, q_max)
    return torch.clamp(torch.round(x / scale) + zero, 0, q_max).to(torch.uint8), scale, zero


def zeropoint_quantize__no_lower_clamp(x, bits, clip_ratio=1.0):
    """Clamps codes only at the top: clipped values below the range wrap around in uint8."""
    q_max = 2**bits - 1
    x = x.float()
    low, high = x.min() * clip_ratio, x.max() * clip_ratio
    scale = ((high - low) / q_max).clamp(min=1e-12)
    zero = torch.round(-low / scale)
    return torch.clamp(torch.round(x / scale) + zero, max=q_max).to(torch.uint8), scale, zero


def zeropoint_quantize__no_constant_guard(x, bits, clip_ratio=1.0):
    """Divides by max - min without the floor: a constant tensor gets Δ = 0."""
    q_max = 2**bits - 1
    x = x.float()
    low, high = x.min() * clip_ratio, x.max() * clip_ratio
    scale = (high - low) / q_max
    zero = torch.round(-low / scale)
    return torch.clamp(torch.round(x / scale) + zero, 0, q_max).to(torch.uint8), scale, zero


def zeropoint_quantize__int8_codes(x, bits, clip_ratio=1.0):
    """Stores the codes as int8, which cannot hold 128..255."""
    q_max = 2**bits - 1
    x = x.float()
    low, high = x.min() * clip_ratio, x.max() * clip_ratio
    scale = ((high - low) / q_max).clamp(min=1e-12)
    zero = torch.round(-low / scale)
    return torch.clamp(torch.round(x / scale) + zero, 0, q_max).to(torch.int8), scale, zero


def zeropoint_dequantize__adds_zero(codes, scale, zero):
    """Adds the zero point instead of subtracting it."""
    return (codes.float() + zero) * scale


def _groupwise(weight, bits, group_size, symmetric, float_zero=False, floor=1e-12):
    """The solution's computation, optionally with a float zero point or another Δ floor."""
    out, inp = weight.shape
    groups = weight.float().reshape(out, inp // group_size, group_size)
    if symmetric:
        q_max = 2 ** (bits - 1) - 1
        scales = groups.abs().amax(dim=-1, keepdim=True).clamp(min=floor) / q_max
        return (torch.clamp(torch.round(groups / scales), -q_max, q_max) * scales).reshape(
            out, inp)
    q_max = 2**bits - 1
    low, high = groups.amin(dim=-1, keepdim=True), groups.amax(dim=-1, keepdim=True)
    scales = ((high - low) / q_max).clamp(min=floor)
    if float_zero:
        zeros = -low / scales
        codes = torch.clamp(torch.round(groups / scales + zeros), 0, q_max)
    else:
        zeros = torch.round(-low / scales)
        codes = torch.clamp(torch.round(groups / scales) + zeros, 0, q_max)
    return ((codes - zeros) * scales).reshape(out, inp)


def groupwise_fake_quantize__strided_groups(weight, bits, group_size, symmetric=False):
    """Groups columns j, j + in/group_size, ... instead of consecutive columns."""
    out, inp = weight.shape
    columns_by_group = weight.reshape(out, group_size, inp // group_size).transpose(1, 2)
    result = _groupwise(columns_by_group.reshape(out, inp), bits, group_size, symmetric)
    return result.reshape(out, inp // group_size, group_size).transpose(1, 2).reshape(out, inp)


def groupwise_fake_quantize__float_zero(weight, bits, group_size, symmetric=False):
    """Keeps the zero point unrounded (llama.cpp's Q4_1), not the integer z of 06.2."""
    return _groupwise(weight, bits, group_size, symmetric, float_zero=True)


def groupwise_fake_quantize__no_zero_guard(weight, bits, group_size, symmetric=False):
    """Omits the 1e-12 floor on Δ: an all-zero group becomes nan."""
    return _groupwise(weight, bits, group_size, symmetric, floor=0.0)


def groupwise_fake_quantize__keeps_input_dtype(weight, bits, group_size, symmetric=False):
    """Computes and returns in the weight's dtype (bf16 in, bf16 out) instead of float32."""
    out, inp = weight.shape
    groups = weight.reshape(out, inp // group_size, group_size)
    q_max = 2**bits - 1
    low, high = groups.amin(dim=-1, keepdim=True), groups.amax(dim=-1, keepdim=True)
    scales = ((high - low) / q_max).clamp(min=1e-12)
    zeros = torch.round(-low / scales)
    if symmetric:
        q_max = 2 ** (bits - 1) - 1
        scales = groups.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / q_max
        zeros = torch.zeros_like(scales)
    codes = torch.clamp(torch.round(groups / scales) + zeros, -q_max if symmetric else 0, q_max)
    return ((codes - zeros) * scales).reshape(out, inp)


def groupwise_fake_quantize__always_asymmetric(weight, bits, group_size, symmetric=False):
    """Ignores symmetric=True."""
    return _groupwise(weight, bits, group_size, symmetric=False)


def pack_int4__high_nibble_first(codes):
    """Puts the first code of each pair in the high nibble."""
    return ((codes[..., 0::2] << 4) | codes[..., 1::2]).to(torch.uint8)


def pack_int4__pairs_across_rows(codes):
    """Pairs codes of the flattened tensor and returns a 1-d result, losing the shape."""
    flat = codes.flatten()
    return (flat[0::2] | (flat[1::2] << 4)).to(torch.uint8)


def unpack_int4__halves_not_interleaved(packed):
    """Returns all low nibbles, then all high nibbles, instead of interleaving them."""
    return torch.cat([packed & 0x0F, packed >> 4], dim=-1)


def unpack_int4__signed_shift(packed):
    """Shifts the bytes as int8: bytes >= 128 give negative high nibbles (and int8 codes)."""
    signed = packed.view(torch.int8)
    return torch.stack([signed & 0x0F, signed >> 4], dim=-1).flatten(-2)


def nf4_quantize__no_zero_guard(blocks, levels):
    """Divides by the absmax without the floor: an all-zero block gets nan codes."""
    absmax = blocks.abs().amax(dim=1).float()
    normalised = blocks.float() / absmax[:, None]
    return (normalised[..., None] - levels).abs().argmin(dim=-1).to(torch.uint8), absmax


def nf4_quantize__uniform_grid(blocks, levels):
    """Rounds to 16 evenly spaced codes, ignoring where the given levels are."""
    absmax = blocks.abs().amax(dim=1).float()
    normalised = blocks.float() / absmax.clamp(min=1e-12)[:, None]
    return torch.round((normalised + 1) * 7.5).to(torch.uint8), absmax


def nf4_quantize__signed_max(blocks, levels):
    """Normalises by the largest value instead of the largest magnitude."""
    absmax = blocks.amax(dim=1).float()
    normalised = blocks.float() / absmax.clamp(min=1e-12)[:, None]
    return (normalised[..., None] - levels).abs().argmin(dim=-1).to(torch.uint8), absmax


def nf4_dequantize__forgets_absmax(codes, absmax, levels):
    """Returns the levels without scaling them back by the block's absmax."""
    return levels[codes.long()]
