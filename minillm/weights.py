"""Weights on disk: safetensors files, Hugging Face tensor names, and loading them into a model.

The low-level half of checkpoint handling, shared by float checkpoints
(:mod:`minillm.checkpoint`) and quantized ones (:mod:`minillm.quant.checkpoint`).
Hugging Face names tensors after its own module tree; :func:`hf_to_minillm_name` maps
them onto ours (``model.layers.3.self_attn.q_proj.weight`` -> ``layers.3.attn.q_proj.weight``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from .assets import AssetError
from .families import layer_names


def hf_to_minillm_name(name: str, family: str = "llama") -> str:
    """``model.layers.3.self_attn.q_proj.weight`` -> ``layers.3.attn.q_proj.weight`` (a
    block's module names depend on the family: :func:`~minillm.families.layer_names`)."""
    name = name.removeprefix("model.")
    match = re.match(r"layers\.(\d+)\.([a-z_]+)\.(.*)", name)
    if match:
        index, module, rest = match.groups()
        return f"layers.{index}.{layer_names(family).get(module, module)}.{rest}"
    return name


def minillm_to_hf_name(name: str, family: str = "llama") -> str:
    """The inverse of :func:`hf_to_minillm_name`."""
    if name == "lm_head.weight":
        return name
    match = re.match(r"layers\.(\d+)\.([a-z_]+)\.(.*)", name)
    if match:
        index, module, rest = match.groups()
        back = {ours: theirs for theirs, ours in layer_names(family).items()}
        name = f"layers.{index}.{back.get(module, module)}.{rest}"
    return "model." + name


def weight_files(directory: Path) -> list[Path]:
    """The safetensors files of a checkpoint: one ``model.safetensors`` or the shards of
    ``model.safetensors.index.json``."""
    index = directory / "model.safetensors.index.json"
    if index.exists():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError) as error:
            raise AssetError(f"{index} is not a valid shard index ({error}); re-download "
                             "the checkpoint.") from None
        return [directory / shard for shard in shards]
    single = directory / "model.safetensors"
    if single.exists():
        return [single]
    raise AssetError(f"no model.safetensors or model.safetensors.index.json in {directory}.")


def load_state_dict(directory: Path, family: str = "llama") -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint of ``family``, renamed to minillm's module names."""
    state = {}
    for file in weight_files(directory):
        try:
            tensors = load_file(file)
        except Exception as error:
            raise AssetError(f"{file} is not a readable safetensors file ({error}). "
                             "Re-download it (for the course model: `minillm fetch --force`).") \
                from error
        state.update({hf_to_minillm_name(k, family): v for k, v in tensors.items()})
    return state


def load_weights(model: nn.Module, state: dict[str, torch.Tensor], source: str,
                 assign: bool = False) -> None:
    """Load ``state`` into ``model``, pointing a tied lm_head at the embedding, and raise an
    :class:`AssetError` naming ``source`` if a tensor is missing or unexpected.
    ``assign=True`` adopts the tensors as they are (for a model built on the meta device)."""
    tied = model.config.tie_word_embeddings
    if tied:  # the lm_head's tensors are the embedding's (a compact one shares its module)
        state = {name: t for name, t in state.items() if not name.startswith("lm_head.")}
    try:
        missing, unexpected = model.load_state_dict(state, strict=False, assign=assign)
    except RuntimeError as error:  # a tensor of the wrong shape
        raise AssetError(f"{source} does not match its config: {error}") from None
    if tied:
        if isinstance(model.lm_head, nn.Linear):
            model.lm_head.weight = model.embed_tokens.weight
        missing = [m for m in missing if not m.startswith("lm_head.")]
    if missing or unexpected:
        raise AssetError(f"{source} does not match its config: "
                         f"missing {missing[:5]}, unexpected {unexpected[:5]}.")


