"""What a decoder costs per token, read off its Hugging Face ``config.json``.

Two numbers decide a decode step on any machine: the bytes of weights it reads (the
*active* parameters: a mixture-of-experts layer reads only the experts its tokens chose) and
the bytes of KV cache it reads (every cached token of every layer, unless a layer attends
only within a sliding window, or caches one compressed latent per token, as MLA does).

The counts below follow each family's modelling code in transformers (Llama, Mistral,
Qwen2, Qwen3, Gemma 3, OLMoE, Qwen3-MoE, DeepSeek-V3) and are tested equal to the
parameter count of the instantiated Hugging Face model.
"""

from __future__ import annotations

from dataclasses import dataclass

MLA_FAMILIES = ("deepseek_v2", "deepseek_v3")
MOE_FAMILIES = ("qwen3_moe", "olmoe", "mixtral", *MLA_FAMILIES)


def layer_windows(hf: dict) -> list[int | None]:
    """Each layer's attention window in tokens (None: it sees the whole context)."""
    layers, window = hf["num_hidden_layers"], hf.get("sliding_window")
    if hf.get("use_sliding_window") is False:  # Qwen: the window is off unless switched on
        window = None
    kinds = hf.get("layer_types")
    if kinds is None and hf.get("model_type") == "gemma3_text":
        pattern = hf.get("sliding_window_pattern", 6)
        kinds = ["sliding_attention" if (i + 1) % pattern else "full_attention"
                 for i in range(layers)]
    if kinds is None:
        return [window] * layers
    return [window if kind == "sliding_attention" else None for kind in kinds]


def kv_numbers_per_token(hf: dict) -> int:
    """Numbers one layer caches per token: K and V of every KV head, or MLA's latent plus
    its shared rotary key."""
    if hf.get("model_type") in MLA_FAMILIES:
        return hf["kv_lora_rank"] + hf["qk_rope_head_dim"]
    heads = hf["num_attention_heads"]
    kv_heads = hf.get("num_key_value_heads") or heads
    return 2 * kv_heads * _head_dim(hf)


def kv_bytes(hf: dict, context: int, bytes_per_value: int = 2) -> int:
    """KV-cache bytes of one sequence of ``context`` tokens, all layers: a windowed layer keeps
    at most its window (an engine may free the blocks wholly outside it; minillm's paged
    engine masks them but does not free them yet)."""
    per_token = kv_numbers_per_token(hf) * bytes_per_value
    return sum(per_token * (context if w is None else min(context, w))
               for w in layer_windows(hf))


@dataclass(frozen=True)
class ParameterCounts:
    total: int  # every weight in the checkpoint (tied embeddings counted once)
    active: int  # weights one token's forward pass reads (routed experts: top-k of them)
    embedding: int  # the input embedding table (and the LM head, when untied, separately)
    lm_head: int  # 0 when the head is the embedding table (tied)

    @property
    def read_per_token(self) -> int:
        """Parameters a batch-1 decode step reads: the active ones, less the embedding table
        (a lookup reads one row) unless it doubles as the LM head."""
        return self.active - (self.embedding if self.lm_head else 0)


def parameter_counts(hf: dict) -> ParameterCounts:
    """Total and per-token active parameters of the decoder described by ``hf``."""
    d, vocab = hf["hidden_size"], hf["vocab_size"]
    embedding = vocab * d
    lm_head = 0 if hf.get("tie_word_embeddings", False) else vocab * d
    total = active = embedding + lm_head + d  # + the final norm
    for layer in range(hf["num_hidden_layers"]):
        attention = _attention_parameters(hf) + _norms_per_layer(hf) * d
        mlp_total, mlp_active = _mlp_parameters(hf, layer)
        total += attention + mlp_total
        active += attention + mlp_active
    return ParameterCounts(total, active, embedding, lm_head)


def _head_dim(hf: dict) -> int:
    return hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]


def _norms_per_layer(hf: dict) -> int:
    """Gemma 3 norms around both sub-layers (four per block); the others before them (two)."""
    return 4 if hf.get("model_type") == "gemma3_text" else 2


def _attention_parameters(hf: dict) -> int:
    if hf.get("model_type") in MLA_FAMILIES:
        return _mla_parameters(hf)
    d, hd, heads = hf["hidden_size"], _head_dim(hf), hf["num_attention_heads"]
    kv_heads = hf.get("num_key_value_heads") or heads
    count = d * hd * (heads + 2 * kv_heads) + heads * hd * d
    family = hf.get("model_type")
    if family == "qwen2" or hf.get("attention_bias"):  # Qwen2: q, k, v always have biases
        count += hd * (heads + 2 * kv_heads) + (d if hf.get("attention_bias") else 0)
    if family in ("qwen3", "qwen3_moe", "gemma3_text"):  # QK-norm, one weight per channel
        count += 2 * hd
    elif family == "olmoe":  # QK-norm over the whole projection
        count += hd * (heads + kv_heads)
    return count


def _mla_parameters(hf: dict) -> int:
    d, heads, rank, rope = (hf["hidden_size"], hf["num_attention_heads"], hf["kv_lora_rank"],
                            hf["qk_rope_head_dim"])
    qk_head, v_head = hf["qk_nope_head_dim"] + rope, hf["v_head_dim"]
    q_rank = hf.get("q_lora_rank")
    queries = d * heads * qk_head if q_rank is None else d * q_rank + q_rank + q_rank * heads \
        * qk_head
    latent = d * (rank + rope) + rank + rank * heads * (hf["qk_nope_head_dim"] + v_head)
    return queries + latent + heads * v_head * d


def _is_moe_layer(hf: dict, layer: int) -> bool:
    family = hf.get("model_type")
    if family not in MOE_FAMILIES:
        return False
    if family in MLA_FAMILIES:
        return layer >= hf.get("first_k_dense_replace", 0) and \
            layer % hf.get("moe_layer_freq", 1) == 0
    if family == "qwen3_moe":
        return layer not in (hf.get("mlp_only_layers") or []) and \
            (layer + 1) % hf.get("decoder_sparse_step", 1) == 0
    return True


def _mlp_parameters(hf: dict, layer: int) -> tuple[int, int]:
    """(total, active) parameters of one layer's feed-forward: SwiGLU/GeGLU has three
    matrices; a routed layer has a router, E experts (k active) and any shared experts."""
    d = hf["hidden_size"]
    if not _is_moe_layer(hf, layer):
        dense = 3 * d * hf["intermediate_size"]
        return dense, dense
    experts = hf.get("n_routed_experts") or hf.get("num_experts") or hf["num_local_experts"]
    expert = 3 * d * (hf.get("moe_intermediate_size") or hf["intermediate_size"])  # Mixtral
    router = d * experts + (experts if hf.get("model_type") in MLA_FAMILIES else 0)  # + bias
    shared = hf.get("n_shared_experts", 0) * expert
    top_k = hf["num_experts_per_tok"]
    return router + experts * expert + shared, router + top_k * expert + shared
