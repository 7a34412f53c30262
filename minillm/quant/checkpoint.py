"""Quantized checkpoints: compressed weights in safetensors, reloaded for generation.

A directory written by :func:`save_quantized` holds

* ``config.json``: the model's Hugging Face config (so the architecture is rebuilt);
* ``model.safetensors``: every tensor of the compressed model — packed codes, scales,
  zeros, metadata, and the remaining float weights (norms; AWQ's folded scales live there);
* ``quantization.json``: for every compressed linear layer, its format (the class, e.g.
  ``QuantLinear`` or ``NF4Linear``) and the options that shaped its storage, plus the token
  embedding's storage (``"fp32"``, or ``"fp16"`` / ``"int8"``), so :func:`load_quantized`
  builds the same modules and then fills them with the saved tensors;
* the tokenizer files, when ``tokenizer_from`` names a checkpoint, so the directory is a
  complete model: ``load_model(dir)`` and ``Tokenizer(dir)`` both accept it.

Every method of the registry (RTN, GPTQ, AWQ, NF4, LLM.int8, FP8, 2:4) saves this way, and
a model may mix formats (layers kept in float are simply not listed).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from safetensors.torch import load_file, save_file
from torch import nn

from ..assets import AssetError
from ..config import ModelConfig
from ..linear import CompressedLinear
from ..model import Transformer
from ..weights import load_weights
from .embedding import CompactEmbedding, compact_embedding
from .fp8 import FP8Linear
from .llm_int8 import Int8Linear
from .nf4 import NF4Linear
from .qlinear import QuantLinear
from .sparsity import Sparse24Linear

QUANTIZATION_FILE = "quantization.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "generation_config.json", "chat_template.jinja")
LINEAR_FORMATS = {cls.__name__: cls for cls in (QuantLinear, NF4Linear, Int8Linear, FP8Linear,
                                                Sparse24Linear)}


def is_quantized_checkpoint(directory: str | Path) -> bool:
    return (Path(directory) / QUANTIZATION_FILE).exists()


def compressed_layers(model: nn.Module) -> dict[str, CompressedLinear]:
    """The model's compressed linear layers by name (not the ones nested inside another)."""
    layers: dict[str, CompressedLinear] = {}
    for name, module in model.named_modules():
        inside = any(name.startswith(outer + ".") for outer in layers)
        if isinstance(module, CompressedLinear) and not inside:
            layers[name] = module
    return layers


def save_quantized(model: Transformer, directory: str | Path,
                   tokenizer_from: str | Path | None = None) -> Path:
    """Write ``model`` (some linear layers compressed, its embedding optionally a
    ``CompactEmbedding``) to ``directory``."""
    layers = {}
    for name, layer in compressed_layers(model).items():
        if type(layer).__name__ not in LINEAR_FORMATS:
            raise ValueError(f"{name} is a {type(layer).__name__}, which has no checkpoint "
                             "format; save the model before transforming it for decoding")
        layers[name] = {"format": type(layer).__name__, "config": layer.format_config()}
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {name: tensor.contiguous() for name, tensor in model.state_dict().items()}
    if model.config.tie_word_embeddings:  # the lm_head's tensors are the embedding's
        state = {name: t for name, t in state.items() if not name.startswith("lm_head.")}
    embedding = (model.embed_tokens.fmt if isinstance(model.embed_tokens, CompactEmbedding)
                 else "fp32")
    save_file(state, directory / "model.safetensors", metadata={"format": "minillm-quantized"})
    (directory / "config.json").write_text(json.dumps(model.config.to_hf(), indent=2))
    (directory / QUANTIZATION_FILE).write_text(json.dumps(
        {"layers": layers, "embedding": embedding}, indent=2))
    if tokenizer_from is not None:
        copy_tokenizer_files(tokenizer_from, directory)
    return directory


def copy_tokenizer_files(source: str | Path, directory: str | Path) -> None:
    """Copy a checkpoint's tokenizer files, so ``Tokenizer(directory)`` works too."""
    for name in TOKENIZER_FILES:
        if (Path(source) / name).exists():
            shutil.copy(Path(source) / name, Path(directory) / name)


def _read_description(directory: Path) -> dict:
    path = directory / QUANTIZATION_FILE
    try:
        description = json.loads(path.read_text())
        for entry in description["layers"].values():
            if entry["format"] not in LINEAR_FORMATS:
                raise ValueError(f"unknown layer format {entry['format']!r}")
    except (ValueError, KeyError, TypeError) as error:
        raise AssetError(f"{path} does not describe a quantized model ({error}); write the "
                         "directory again with `minillm quantize`.") from None
    return description


def load_quantized(directory: str | Path, attn_backend: str = "sdpa") -> nn.Module:
    """Rebuild a model written by :func:`save_quantized`, with its compressed weights."""
    directory = Path(directory)
    if not is_quantized_checkpoint(directory):
        raise AssetError(f"{directory} has no {QUANTIZATION_FILE}: not a quantized checkpoint "
                         "(write one with `minillm quantize` or save_quantized).")
    description = _read_description(directory)
    model = Transformer(ModelConfig.from_json(directory / "config.json"), attn_backend)
    for name, entry in description["layers"].items():
        layer_format = LINEAR_FORMATS[entry["format"]]
        model.set_submodule(name, layer_format.from_format_config(model.get_submodule(name),
                                                                  entry["config"]))
    if description.get("embedding", "fp32") != "fp32":
        compact_embedding(model, description["embedding"])
    try:
        state = load_file(directory / "model.safetensors")
    except Exception as error:
        raise AssetError(f"{directory / 'model.safetensors'} is not a readable safetensors file "
                         f"({error}); write the directory again with `minillm quantize`.") \
            from None
    load_weights(model, state, f"quantized checkpoint {directory}")
    return model.eval()
