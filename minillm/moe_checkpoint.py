"""Mixture-of-experts layers in Hugging Face checkpoints: each family's config fields and
tensor names, read into :class:`minillm.moe.MoE`'s arguments and state dict.

Qwen2-MoE, Qwen3-MoE and OLMoE call the experts ``num_experts``, Mixtral
``num_local_experts``, DeepSeek-V3 ``n_routed_experts``; the width of an expert is
``moe_intermediate_size`` (or ``intermediate_size`` where a family has no dense layers).
Checkpoints hold one ``gate_proj``/``up_proj``/``down_proj`` (Mixtral: ``w1``/``w3``/
``w2``) per expert; the layer stacks them into [E, ...] tensors, as transformers 5 does in
memory (its ``gate_up_proj``). Which layers are sparse: DeepSeek's first
``first_k_dense_replace`` are dense, Qwen's ``mlp_only_layers`` too, and Qwen's
``decoder_sparse_step`` spaces the sparse ones.
"""

from __future__ import annotations

import torch

# model_type -> the defaults transformers' config class has for fields a config may omit
HF_DEFAULTS = {"qwen2_moe": {"norm_topk_prob": False, "shared_expert_intermediate_size": 5632},
               "qwen3_moe": {"norm_topk_prob": False}, "olmoe": {"norm_topk_prob": False},
               "mixtral": {"norm_topk_prob": True},
               "deepseek_v3": {"norm_topk_prob": True, "scoring_func": "sigmoid",
                               "n_group": 1, "topk_group": 1, "n_shared_experts": 1,
                               "routed_scaling_factor": 2.5}}


def moe_arguments(config: dict) -> dict:
    """:class:`~minillm.moe.MoE`'s arguments from a Hugging Face config dict."""
    kind = config.get("model_type")
    if kind not in HF_DEFAULTS:
        raise ValueError(f"no MoE mapping for model_type {kind!r}; known: {sorted(HF_DEFAULTS)}")
    if config.get("hidden_act", "silu") != "silu":
        raise ValueError(f"experts must be SwiGLU (hidden_act silu), got {config['hidden_act']!r}")
    c = {**HF_DEFAULTS[kind], **config}
    expert_size = c.get("moe_intermediate_size") or c["intermediate_size"]
    shared = (c["shared_expert_intermediate_size"] if kind == "qwen2_moe"
              else (c.get("n_shared_experts") or 0) * expert_size)
    return dict(hidden_size=c["hidden_size"], expert_intermediate_size=expert_size,
                num_experts=c.get("n_routed_experts") or c.get("num_experts")
                or c["num_local_experts"],
                top_k=c["num_experts_per_tok"], norm_topk_prob=c["norm_topk_prob"],
                shared_intermediate_size=shared or None, shared_gate=kind == "qwen2_moe",
                scoring=c.get("scoring_func", "softmax"),
                routed_scaling_factor=c.get("routed_scaling_factor", 1.0),
                num_groups=c.get("n_group") or 1, top_groups=c.get("topk_group") or 1)


def is_moe_layer(config: dict, layer_index: int) -> bool:
    """Whether layer ``layer_index`` of a Hugging Face MoE config is sparse: DeepSeek's
    first ``first_k_dense_replace`` layers and Qwen's ``mlp_only_layers`` are dense."""
    if layer_index in config.get("mlp_only_layers", []):
        return False
    if layer_index < config.get("first_k_dense_replace", 0):
        return False
    return (layer_index + 1) % config.get("decoder_sparse_step", 1) == 0


def hf_layer_prefix(config: dict, layer_index: int) -> str:
    """Where layer ``layer_index``'s MoE tensors live in the family's safetensors."""
    block = "block_sparse_moe" if config.get("model_type") == "mixtral" else "mlp"
    return f"model.layers.{layer_index}.{block}."


HF_EXPERT_NAMES = {"gate_proj": ("gate_proj", "w1"), "up_proj": ("up_proj", "w3"),
                   "down_proj": ("down_proj", "w2")}  # ours -> (Qwen/OLMoE/DeepSeek, Mixtral)


def stack_experts(layer: dict[str, torch.Tensor], kind: str, num_experts: int) -> torch.Tensor:
    """[E, out, in]: expert e's ``kind`` weight (``experts.{e}.<name>.weight``) at index e."""
    def weight(e: int) -> torch.Tensor:
        for name in HF_EXPERT_NAMES[kind]:
            if f"experts.{e}.{name}.weight" in layer:
                return layer[f"experts.{e}.{name}.weight"]
        raise KeyError(f"no {kind} weight for expert {e} (looked for experts.{e}."
                       f"{{{','.join(HF_EXPERT_NAMES[kind])}}}.weight); is num_experts right?")
    return torch.stack([weight(e) for e in range(num_experts)])


# Qwen2-MoE's names for the shared expert and its gate -> ours (DeepSeek's)
QWEN2_SHARED = {"shared_expert": "shared_experts",
                "shared_expert_gate": "shared_experts.output_gate"}


def our_name(name: str) -> str:
    """A layer's tensor name as :class:`~minillm.moe.MoE` calls it."""
    module, rest = name.split(".", 1)
    return f"{QWEN2_SHARED.get(module, module)}.{rest}"


def state_from_hf(tensors: dict[str, torch.Tensor], prefix: str,
                  num_experts: int) -> dict[str, torch.Tensor]:
    """:class:`~minillm.moe.MoE`'s state dict from one layer's safetensors tensors under
    ``prefix`` (``model.layers.3.mlp.``; Mixtral's ``model.layers.3.block_sparse_moe.``): the
    per-expert weights the checkpoints hold are stacked into [E, ...] tensors (an already
    fused ``experts.gate_up_proj`` is taken as it is)."""
    layer = {our_name(name[len(prefix):]): t for name, t in tensors.items()
             if name.startswith(prefix)}
    state = {k: v for k, v in layer.items() if k.startswith(
        ("gate.", "shared_experts.", "experts.gate_up_proj", "experts.down_proj"))}
    if "experts.gate_up_proj" not in state:
        state["experts.gate_up_proj"] = torch.cat([stack_experts(layer, "gate_proj", num_experts),
                                                   stack_experts(layer, "up_proj", num_experts)], 1)
        state["experts.down_proj"] = stack_experts(layer, "down_proj", num_experts)
    return state


# -- a whole model: config fields and the experts of every sparse layer -----------------


def moe_fields(hf: dict) -> dict:
    """:class:`~minillm.config.ModelConfig`'s ``moe`` (the layer's arguments) and
    ``moe_layers`` (the sparse layers' indices) from a Hugging Face MoE config."""
    layers = [i for i in range(hf["num_hidden_layers"]) if is_moe_layer(hf, i)]
    return {"moe": moe_arguments(hf), "moe_layers": layers}


def moe_hf_fields(family: str, moe: dict, moe_layers: list[int], num_layers: int) -> dict:
    """The inverse of :func:`moe_fields`: the MoE fields of ``family``'s config.json."""
    fields = {"num_local_experts" if family == "mixtral" else "num_experts": moe["num_experts"],
              "num_experts_per_tok": moe["top_k"]}
    if family != "mixtral":  # Mixtral always renormalises and has no such field
        fields["norm_topk_prob"] = moe["norm_topk_prob"]
    if family in ("qwen2_moe", "qwen3_moe"):
        fields.update(moe_intermediate_size=moe["expert_intermediate_size"],
                      decoder_sparse_step=1,
                      mlp_only_layers=[i for i in range(num_layers) if i not in moe_layers])
    if family == "qwen2_moe":
        fields["shared_expert_intermediate_size"] = moe["shared_intermediate_size"] or 0
    if family == "deepseek_v3":
        width = moe["expert_intermediate_size"]
        fields.update(n_routed_experts=fields.pop("num_experts"), moe_intermediate_size=width,
                      n_shared_experts=(moe["shared_intermediate_size"] or 0) // width,
                      scoring_func=moe["scoring"], n_group=moe["num_groups"],
                      topk_group=moe["top_groups"],
                      routed_scaling_factor=moe["routed_scaling_factor"],
                      first_k_dense_replace=min(moe_layers, default=num_layers))
    return fields


def stack_model_experts(state: dict[str, torch.Tensor], moe_layers: list[int],
                        num_experts: int) -> dict[str, torch.Tensor]:
    """A whole model's state dict (minillm's names, ``layers.3.mlp.experts.0.gate_proj.weight``
    as the checkpoint has them) with every sparse layer's experts stacked (a new dict)."""
    state = dict(state)
    for index in moe_layers:
        prefix = f"layers.{index}.mlp."
        layer = state_from_hf(state, prefix, num_experts)
        state = {name: t for name, t in state.items() if not name.startswith(prefix)}
        state.update({prefix + name: t for name, t in layer.items()})
    return state


def experts_to_hf(layer: dict[str, torch.Tensor], family: str) -> dict[str, torch.Tensor]:
    """The inverse of :func:`state_from_hf` for one layer's state dict (names relative to the
    layer): one tensor per expert and projection, named as ``family``'s checkpoints name them."""
    gate_name, up_name, down_name = (HF_EXPERT_NAMES[kind][family == "mixtral"]
                                     for kind in ("gate_proj", "up_proj", "down_proj"))
    out = {}
    for name, tensor in layer.items():
        if name == "experts.gate_up_proj":
            gates, ups = tensor.chunk(2, dim=1)
            for e in range(len(tensor)):
                out[f"experts.{e}.{gate_name}.weight"] = gates[e].clone()
                out[f"experts.{e}.{up_name}.weight"] = ups[e].clone()
        elif name == "experts.down_proj":
            out.update({f"experts.{e}.{down_name}.weight": down.clone()
                        for e, down in enumerate(tensor)})
        elif family == "qwen2_moe" and name.startswith("shared_experts."):
            theirs = {ours: theirs for theirs, ours in QWEN2_SHARED.items()}
            module = "shared_experts.output_gate" if ".output_gate." in name else "shared_experts"
            out[theirs[module] + name[len(module):]] = tensor
        else:
            out[name] = tensor
    return out
