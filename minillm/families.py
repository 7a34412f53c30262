"""Reading and writing the Hugging Face config fields that tell minillm's families apart.

:class:`~minillm.config.ModelConfig` holds the fields every decoder shares and, after them,
the few that say how a family differs from Llama (its docstring has the table).
:func:`family_fields` reads those from a ``config.json`` dict, refusing the options minillm
does not compute; :func:`family_hf_fields` writes them back, so a saved model loads in
transformers; :func:`layer_names` maps a family's module names inside a decoder layer
onto minillm's.
"""

from __future__ import annotations

from .moe_checkpoint import moe_fields, moe_hf_fields

MOE_FAMILIES = ("qwen2_moe", "qwen3_moe", "olmoe", "mixtral", "deepseek_v3")
MLA_FAMILIES = ("deepseek_v3",)
FAMILIES = ("llama", "smollm", "mistral", "qwen2", "qwen3", "gemma3_text",
            *MOE_FAMILIES)  # model_type
MLA_FIELDS = ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
              "q_lora_rank")  # DeepSeek's names, minillm.mla.LatentShape's too
QWEN = ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe")  # whose windows use_sliding_window switches on
SLIDING, FULL = "sliding_attention", "full_attention"  # Hugging Face's layer_types


def family_fields(hf: dict) -> dict:
    """The :class:`~minillm.config.ModelConfig` fields that tell the families apart, read
    from a Hugging Face config dict (the fields every family shares are read by
    ``ModelConfig.from_hf``)."""
    family = hf.get("model_type") or "llama"
    if family not in FAMILIES:
        raise ValueError(f"model_type {family!r} is not a family minillm implements; it loads "
                         f"{', '.join(FAMILIES)} checkpoints (dense decoders)")
    _refuse_unsupported(hf)
    fields = {"family": family, **_windows(hf)}
    if family in ("qwen2", "qwen2_moe"):
        fields["qkv_bias"] = hf.get("qkv_bias", True)
    if family in ("qwen3", "qwen3_moe", "olmoe"):
        fields.update(qk_norm=True, qk_norm_whole=family == "olmoe")
    if family in MOE_FAMILIES:
        fields.update(moe_fields(hf))
    if family in MLA_FAMILIES:  # RoPE turns only the qk_rope_head_dim channels
        fields.update(mla={**{name: hf.get(name) for name in MLA_FIELDS},
                           "rope_interleave": hf.get("rope_interleave", True)},
                      head_dim=hf["qk_rope_head_dim"])
    if family == "gemma3_text":
        fields.update(tie_word_embeddings=hf.get("tie_word_embeddings", True), qk_norm=True,
                      gemma_norms=True, hidden_act="gelu_pytorch_tanh",
                      embedding_scale=hf["hidden_size"] ** 0.5,
                      query_pre_attn_scalar=float(hf.get("query_pre_attn_scalar", 256)),
                      rope_local_theta=float(_local_rope_theta(hf)))
    act = hf.get("hidden_activation") or hf.get("hidden_act")
    if act is not None:
        fields["hidden_act"] = act
    return fields


def global_rope_parameters(hf: dict) -> dict:
    """The RoPE parameters of the model's global (or only) layers: transformers 5 nests
    Gemma 3's under ``rope_parameters["full_attention"]``."""
    rope = dict(hf.get("rope_parameters") or {})
    return dict(rope.get(FULL) or {}) if FULL in rope else rope


def _local_rope_theta(hf: dict) -> float:
    """Gemma 3's RoPE base for its local layers: ``rope_local_base_freq`` in older configs,
    ``rope_parameters["sliding_attention"]["rope_theta"]`` in transformers 5's."""
    local = (hf.get("rope_parameters") or {}).get(SLIDING) or {}
    if local.get("rope_type", "default") != "default":
        raise ValueError(f"the local layers' rope type {local['rope_type']!r} is not "
                         "supported; minillm gives Gemma's local layers the default RoPE")
    return local.get("rope_theta", hf.get("rope_local_base_freq", 10000.0))


def _windows(hf: dict) -> dict:
    """``sliding_window`` and ``layer_types``: which layers attend to a window only. A
    window as long as the context hides nothing and is dropped."""
    window = hf.get("sliding_window")
    if hf.get("model_type") in QWEN and not hf.get("use_sliding_window", False):
        window = None
    if window is None or window >= hf.get("max_position_embeddings", 2048):
        return {}
    layers = hf["num_hidden_layers"]
    types = hf.get("layer_types")
    if types is None and hf.get("model_type") == "gemma3_text":
        pattern = hf.get("sliding_window_pattern", hf.get("_sliding_window_pattern", 6))
        types = [SLIDING if (i + 1) % pattern else FULL for i in range(layers)]
    elif types is None and hf.get("model_type") in QWEN:
        first = hf.get("max_window_layers", layers)
        types = [SLIDING if i >= first else FULL for i in range(layers)]
    if types is not None and set(types) - {SLIDING, FULL}:
        raise ValueError(f"layer_types {sorted(set(types) - {SLIDING, FULL})} are not "
                         f"supported; minillm knows {SLIDING!r} and {FULL!r}")
    return {"sliding_window": window, "layer_types": None if types is None else list(types)}


def _refuse_unsupported(hf: dict) -> None:
    """Refuse options that would change the computation in ways minillm does not follow."""
    for name in ("final_logit_softcapping", "attn_logit_softcapping"):
        if hf.get(name) is not None:
            raise ValueError(f"{name}={hf[name]} (Gemma 2's tanh soft-capping) is not "
                             "implemented; minillm runs Gemma 3, which has none")
    if hf.get("clip_qkv") is not None:
        raise ValueError(f"clip_qkv={hf['clip_qkv']} (OLMo's clamped q, k, v) is not "
                         "implemented; minillm runs OLMoE checkpoints without it")
    if hf.get("use_bidirectional_attention"):
        raise ValueError("use_bidirectional_attention=True (an encoder-style Gemma) is not "
                         "a causal decoder; minillm runs causal language models only")


def family_hf_fields(config) -> dict:
    """The family-specific fields of a Hugging Face config for ``config`` (the inverse of
    :func:`family_fields`), so a saved model loads back, here and in transformers."""
    fields = {"model_type": config.family}
    if config.sliding_window is not None:
        fields["sliding_window"] = config.sliding_window
        if config.layer_types is not None:
            fields["layer_types"] = list(config.layer_types)
        if config.family in QWEN:
            fields["use_sliding_window"] = True
    elif config.family in ("mistral", "gemma3_text", "mixtral", *QWEN):
        fields["sliding_window"] = None
    if config.family == "gemma3_text":
        fields.update(hidden_activation=config.hidden_act,
                      query_pre_attn_scalar=_int_if_whole(config.query_pre_attn_scalar),
                      rope_parameters={FULL: {"rope_type": "default", **(config.rope_scaling or {}),
                                              "rope_theta": config.rope_theta},
                                       SLIDING: {"rope_type": "default",
                                                 "rope_theta": config.rope_local_theta}})
    else:
        fields["hidden_act"] = config.hidden_act
    if config.family == "qwen2_moe":
        fields["qkv_bias"] = config.qkv_bias
    if config.mla is not None:
        fields.update(config.mla, qk_rope_head_dim=config.head_dim)
    if config.moe is not None:
        fields.update(moe_hf_fields(config.family, config.moe, config.moe_layers,
                                    config.num_layers))
    return fields


def _int_if_whole(x: float) -> int | float:
    return int(x) if float(x).is_integer() else x


# Hugging Face's names of a block's modules -> ours (a Gemma block has four norms: its
# ``post_attention_layernorm`` is the norm of the attention's output, not the MLP's input)
LLAMA_LAYER_NAMES = {"input_layernorm": "attn_norm", "post_attention_layernorm": "mlp_norm",
                     "self_attn": "attn"}
GEMMA_LAYER_NAMES = {"input_layernorm": "attn_norm", "post_attention_layernorm": "attn_out_norm",
                     "pre_feedforward_layernorm": "mlp_norm",
                     "post_feedforward_layernorm": "mlp_out_norm", "self_attn": "attn"}


MIXTRAL_LAYER_NAMES = {**LLAMA_LAYER_NAMES, "block_sparse_moe": "mlp"}


def layer_names(family: str) -> dict[str, str]:
    """Hugging Face's module names inside a decoder layer, mapped to minillm's."""
    return {"gemma3_text": GEMMA_LAYER_NAMES,
            "mixtral": MIXTRAL_LAYER_NAMES}.get(family, LLAMA_LAYER_NAMES)
