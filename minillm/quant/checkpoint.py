"""Quantized checkpoints: packed integer weights in safetensors, reloaded for generation.

A directory written by :func:`save_quantized` holds

* ``config.json``: the model's Hugging Face config (so the architecture is rebuilt);
* ``model.safetensors``: every tensor of the quantized model — packed codes (uint8), fp16
  scales and zeros, and the remaining float weights (embedding, norms; AWQ's folded scales
  live in the norms);
* ``quantization.json``: the :class:`~minillm.quant.basic.QuantScheme`, which layers were
  left in float (``skip``) and the token embedding's storage (``"fp32"``, or ``"fp16"`` /
  ``"int8"`` for a :class:`~minillm.quant.embedding.CompactEmbedding`), so
  :func:`load_quantized` builds the same modules;
* the tokenizer files, when ``tokenizer_from`` names a checkpoint, so the directory is a
  complete model: ``load_model(dir)`` and ``Tokenizer(dir)`` both accept it.

Any quantizer that produces ``QuantLinear`` layers (round to nearest, GPTQ, AWQ) saves this way.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path

from safetensors.torch import load_file, save_file
from torch import nn

from ..assets import AssetError
from ..checkpoint import load_weights
from ..config import ModelConfig
from ..model import Transformer
from .basic import QuantScheme
from .embedding import CompactEmbedding, compact_embedding
from .qlinear import quantize_model

QUANTIZATION_FILE = "quantization.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "generation_config.json", "chat_template.jinja")


def is_quantized_checkpoint(directory: str | Path) -> bool:
    return (Path(directory) / QUANTIZATION_FILE).exists()


def save_quantized(model: Transformer, directory: str | Path, scheme: QuantScheme,
                   skip: tuple[str, ...] = ("lm_head",),
                   tokenizer_from: str | Path | None = None) -> Path:
    """Write ``model`` (its linear layers already ``QuantLinear``, its embedding optionally
    a ``CompactEmbedding``) to ``directory``."""
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
        {"scheme": asdict(scheme), "skip": list(skip), "embedding": embedding}, indent=2))
    if tokenizer_from is not None:
        for name in TOKENIZER_FILES:
            if (Path(tokenizer_from) / name).exists():
                shutil.copy(Path(tokenizer_from) / name, directory / name)
    return directory


def load_quantized(directory: str | Path, attn_backend: str = "sdpa") -> nn.Module:
    """Rebuild a model written by :func:`save_quantized`, with its packed integer weights."""
    directory = Path(directory)
    if not is_quantized_checkpoint(directory):
        raise AssetError(f"{directory} has no {QUANTIZATION_FILE}: not a quantized checkpoint "
                         "(write one with `minillm quantize` or save_quantized).")
    meta = json.loads((directory / QUANTIZATION_FILE).read_text())
    config = ModelConfig.from_json(directory / "config.json")
    model = quantize_model(Transformer(config, attn_backend), QuantScheme(**meta["scheme"]),
                           tuple(meta["skip"]))
    if meta.get("embedding", "fp32") != "fp32":
        compact_embedding(model, meta["embedding"])
    load_weights(model, load_file(directory / "model.safetensors"),
                 f"quantized checkpoint {directory} (with its scheme)")
    return model.eval()
