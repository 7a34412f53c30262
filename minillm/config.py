"""ModelConfig: the handful of numbers that define a decoder of one of minillm's families.

Hugging Face ``config.json`` files carry many more fields; we keep only those that
change the computation, under names that say what they are. ``from_hf`` reads both
the older layout (``rope_theta``/``rope_scaling`` at the top level) and the newer one
(``rope_parameters``) that transformers 5 writes. The defaults are Llama's; the fields
after ``eos_token_ids`` say how another family differs.

Every family runs through the one decoder of :mod:`minillm.model`; what differs between
them is configuration, read by :mod:`minillm.families`, and the few small components it
switches on:

=============  ==============================================================================
family         differences from Llama
=============  ==============================================================================
llama, smollm  none
mistral        a sliding window: each token attends to the last ``sliding_window`` tokens
qwen2          biases on the q, k and v projections (Qwen2 and Qwen2.5)
qwen3          RMSNorm over each head of q and k, before RoPE ("QK-norm")
gemma3_text    the ``(1 + w)`` RMSNorm, four norms per block (around attention and the MLP),
               GeGLU with tanh-GELU, embeddings times √hidden, QK-norm, scores scaled by
               ``query_pre_attn_scalar``⁻½, and local (sliding-window) layers between global
               ones, each kind with its own RoPE base
qwen2_moe,     mixture-of-experts layers (:mod:`minillm.moe`) in place of the MLP, on the layers
qwen3_moe,     ``moe_layers`` names; otherwise Qwen2's, Qwen3's, Llama's and Mistral's
mixtral        attention (Qwen2-MoE's shared expert is gated)
olmoe          mixture-of-experts layers, and QK-norm over the whole q and k projections
               (not per head: ``qk_norm_whole``)
deepseek_v3    multi-head latent attention (:mod:`minillm.mla`: ``mla``, RoPE over its
               ``qk_rope_head_dim`` channels only) and mixture-of-experts layers with
               sigmoid routing and a shared expert after ``first_k_dense_replace`` dense ones;
               the dense loop caches its latents, the paged engine refuses it for now
=============  ==============================================================================

Qwen2 and Qwen3 configs may ask for sliding windows too (``use_sliding_window``, on the
layers from ``max_window_layers`` up); those are read the same way as Gemma's layer types.
Other families are refused with the list of the supported ones.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .families import FULL, SLIDING, family_fields, family_hf_fields, global_rope_parameters

ACTIVATIONS = ("silu", "gelu_pytorch_tanh")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


@dataclass
class ModelConfig:
    vocab_size: int = 49152
    hidden_size: int = 576
    intermediate_size: int = 1536
    num_layers: int = 30
    num_heads: int = 9
    num_kv_heads: int = 3  # == num_heads: MHA; 1: MQA; in between: GQA
    head_dim: int = 64
    max_position_embeddings: int = 8192
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # e.g. {"rope_type": "llama3", "factor": 8.0, ...}
    tie_word_embeddings: bool = True
    attention_bias: bool = False
    mlp_bias: bool = False
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    # how the other families differ from Llama (minillm.families reads them)
    family: str = "llama"  # Hugging Face's model_type
    qkv_bias: bool = False  # biases on q, k and v only (Qwen2)
    qk_norm: bool = False  # RMSNorm over each head of q and k, before RoPE (Qwen3, Gemma 3)
    gemma_norms: bool = False  # (1 + w) RMSNorms, and norms after attention and the MLP too
    hidden_act: str = "silu"  # the MLP's gate: silu (SwiGLU) or gelu_pytorch_tanh (GeGLU)
    embedding_scale: float = 1.0  # embeddings are multiplied by it (Gemma: sqrt(hidden))
    query_pre_attn_scalar: float | None = None  # scores scaled by its -1/2 power, not head_dim's
    sliding_window: int | None = None  # sliding layers see only the last this-many tokens
    layer_types: list[str] | None = None  # per layer: sliding/full_attention (None: all alike)
    rope_local_theta: float | None = None  # RoPE base of the sliding layers (Gemma 3)
    qk_norm_whole: bool = False  # QK-norm over the whole q and k projections (OLMoE)
    moe: dict | None = None  # the MoE layer's arguments (minillm.moe.MoE), for sparse layers
    moe_layers: list[int] | None = None  # the sparse layers: their MLP is moe's MoE
    mla: dict | None = None  # multi-head latent attention's sizes (minillm.mla.LatentShape);
    # head_dim is then its rotary part, qk_rope_head_dim

    def __post_init__(self):
        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads}): each key/value head serves a whole group of query heads."
            )
        rope_type = (self.rope_scaling or {}).get("rope_type", "default")
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(
                f"rope scaling type {rope_type!r} is not supported; "
                f"minillm implements {', '.join(SUPPORTED_ROPE_TYPES)}."
            )
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"activation {self.hidden_act!r} is not supported; minillm "
                             f"implements {', '.join(ACTIVATIONS)}")
        if self.layer_types is not None and len(self.layer_types) != self.num_layers:
            raise ValueError(f"layer_types names {len(self.layer_types)} layers; the model "
                             f"has {self.num_layers}")

    def attention_kinds(self) -> list[AttentionKind]:
        """How each layer attends: its window and which RoPE table it reads."""
        types = self.layer_types or [SLIDING if self.sliding_window else FULL] * self.num_layers
        return [AttentionKind(self.sliding_window, self.rope_local_theta is not None)
                if kind == SLIDING else AttentionKind() for kind in types]

    def has_windows(self) -> bool:
        return any(kind.window is not None for kind in self.attention_kinds())

    def release_window(self) -> int | None:
        """How far behind the newest token a key may still be read by some layer: the widest
        layer window, or None if any layer attends to everything. The paged engine gives
        back the blocks behind it."""
        windows = [kind.window for kind in self.attention_kinds()]
        return None if None in windows else max(windows)

    def differences_from_llama(self) -> list[str]:
        """What this model computes that a Llama block (with or without its optional biases)
        does not, in words; empty for Llama. Executors and transformations written for the
        Llama block refuse the rest."""
        differences = [("biases on q, k and v only", self.qkv_bias), ("QK-norm", self.qk_norm),
                       ("Gemma's (1 + w) norms around attention and the MLP", self.gemma_norms),
                       (f"a {self.hidden_act} MLP", self.hidden_act != "silu"),
                       ("scaled embeddings", self.embedding_scale != 1.0),
                       ("query_pre_attn_scalar", self.query_pre_attn_scalar is not None),
                       ("sliding-window layers", self.has_windows()),
                       ("mixture-of-experts layers", self.moe is not None),
                       ("multi-head latent attention", self.mla is not None)]
        return [what for what, present in differences if present]

    def is_moe_layer(self, layer_index: int) -> bool:
        """Whether layer ``layer_index``'s feed-forward is the MoE layer (else the MLP)."""
        return self.moe is not None and layer_index in self.moe_layers

    @property
    def queries_per_kv_head(self) -> int:
        return self.num_heads // self.num_kv_heads

    @classmethod
    def from_hf(cls, hf: dict) -> ModelConfig:
        """Build from a Hugging Face config of a supported family (a dict, as in config.json)."""
        family = family_fields(hf)
        rope = global_rope_parameters(hf)
        rope_theta = hf.get("rope_theta", rope.get("rope_theta", 10000.0))
        scaling = hf.get("rope_scaling") or {k: v for k, v in rope.items() if k != "rope_theta"}
        if scaling:
            scaling = dict(scaling)
            scaling.setdefault("rope_type", scaling.pop("type", "default"))
            if scaling["rope_type"] == "default":
                scaling = None
        eos = hf.get("eos_token_id")
        heads = hf["num_attention_heads"]
        return cls(**{**dict(
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=hf.get("num_key_value_heads") or heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
            max_position_embeddings=hf.get("max_position_embeddings", 2048),
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta),
            rope_scaling=scaling or None,
            tie_word_embeddings=hf.get("tie_word_embeddings", False),
            attention_bias=hf.get("attention_bias", False),
            mlp_bias=hf.get("mlp_bias", False),
            bos_token_id=hf.get("bos_token_id"),
            eos_token_ids=[] if eos is None else ([eos] if isinstance(eos, int) else list(eos)),
        ), **family})

    @classmethod
    def from_json(cls, path: str | Path) -> ModelConfig:
        """Read a ``config.json``; errors name the file and say what to do."""
        try:
            hf = json.loads(Path(path).read_text())
        except ValueError as error:
            raise ValueError(f"{path} is not valid JSON ({error}); restore the checkpoint's "
                             "config.json (for the course model: `minillm fetch --force`)") \
                from None
        try:
            return cls.from_hf(hf)
        except KeyError as error:
            raise ValueError(f"{path} has no {error} field; it is not a Hugging Face "
                             "decoder config") from None
        except ValueError as error:
            raise ValueError(f"{path}: {error}") from None

    def to_hf(self) -> dict:
        """The same model as a Hugging Face config dict of its family (``LlamaConfig``'s for
        Llama; parity tests and ``save_model`` use it)."""
        hf = {
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "mlp_bias": self.mlp_bias,
            **family_hf_fields(self),
        }
        if self.rope_scaling and self.family != "gemma3_text":
            hf["rope_scaling"] = dict(self.rope_scaling)
        return hf

    def num_parameters(self) -> int:
        """Parameter count from the config alone (embeddings counted once when tied)."""
        d, h = self.hidden_size, self.head_dim
        q_kv = h * (self.num_heads + 2 * self.num_kv_heads)
        attn = d * q_kv + self.num_heads * h * d
        attn += q_kv * (self.qkv_bias or self.attention_bias) + d * self.attention_bias
        q_kv_norm = h * (self.num_heads + self.num_kv_heads) if self.qk_norm_whole else 2 * h
        attn += q_kv_norm * self.qk_norm
        if self.mla is not None:
            attn = self._mla_parameters()
        mlp = 3 * d * self.intermediate_size + (2 * self.intermediate_size + d) * self.mlp_bias
        per_layer = attn + (4 if self.gemma_norms else 2) * d
        feed_forward = sum(self._moe_parameters() if self.is_moe_layer(i) else mlp
                           for i in range(self.num_layers))
        embed = self.vocab_size * d * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * per_layer + feed_forward + embed + d

    def _mla_parameters(self) -> int:
        """One MLA layer's parameters: low-rank (or full) queries, the latent and rotary-key
        projection with its norm, the up-projection of keys and values, the output."""
        d, heads, m = self.hidden_size, self.num_heads, self.mla
        qk_head = m["qk_nope_head_dim"] + m["qk_rope_head_dim"]
        q_rank = m["q_lora_rank"]
        queries = d * heads * qk_head if q_rank is None else \
            d * q_rank + q_rank + q_rank * heads * qk_head
        rank = m["kv_lora_rank"]
        latent = d * (rank + m["qk_rope_head_dim"]) + rank + \
            rank * heads * (m["qk_nope_head_dim"] + m["v_head_dim"])
        return queries + latent + heads * m["v_head_dim"] * d

    def _moe_parameters(self) -> int:
        """One MoE layer's parameters: the router, E SwiGLU experts and any shared ones."""
        d, moe = self.hidden_size, self.moe
        shared = moe["shared_intermediate_size"] or 0
        return (d * moe["num_experts"] + 3 * d * moe["expert_intermediate_size"]
                * moe["num_experts"] + 3 * d * shared + d * (moe["shared_gate"] and shared > 0))

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class AttentionKind:
    """What may differ between the attention layers of one model: a sliding ``window``
    (None: every earlier token is seen) and whether RoPE uses the local base
    (``rope_local_theta``, Gemma 3's sliding layers). Layers of one kind share their RoPE
    tables and attention mask."""

    window: int | None = None
    local_rope: bool = False
