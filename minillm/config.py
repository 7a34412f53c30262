"""ModelConfig: the handful of numbers that define a Llama-family decoder.

Hugging Face ``config.json`` files carry many more fields; we keep only those that
change the computation, under names that say what they are. ``from_hf`` reads both
the older layout (``rope_theta``/``rope_scaling`` at the top level) and the newer one
(``rope_parameters``) that transformers 5 writes.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


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

    @property
    def queries_per_kv_head(self) -> int:
        return self.num_heads // self.num_kv_heads

    @classmethod
    def from_hf(cls, hf: dict) -> ModelConfig:
        """Build from a Hugging Face Llama config (a dict, as in config.json)."""
        if hf.get("model_type") not in (None, "llama", "mistral", "smollm"):
            raise ValueError(
                f"model_type {hf.get('model_type')!r} is not a Llama-family decoder; "
                "minillm loads Llama-architecture checkpoints (Llama, SmolLM, Mistral)."
            )
        window = hf.get("sliding_window")
        if window is not None and window < hf.get("max_position_embeddings", 2048):
            raise ValueError(
                f"this config has sliding_window={window}: its attention sees only the last "
                f"{window} tokens, which minillm's engine does not implement yet (Mistral's "
                "and Gemma's windows arrive with the model-families work); it would silently "
                "differ from the model past the window. Use a checkpoint without a window, "
                "or set sliding_window to null only if the model was trained without one.")
        rope = dict(hf.get("rope_parameters") or {})
        rope_theta = hf.get("rope_theta", rope.get("rope_theta", 10000.0))
        scaling = hf.get("rope_scaling") or {k: v for k, v in rope.items() if k != "rope_theta"}
        if scaling:
            scaling = dict(scaling)
            scaling.setdefault("rope_type", scaling.pop("type", "default"))
            if scaling["rope_type"] == "default":
                scaling = None
        eos = hf.get("eos_token_id")
        heads = hf["num_attention_heads"]
        return cls(
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
        )

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
            raise ValueError(f"{path} has no {error} field; it is not a Llama-family "
                             "Hugging Face config") from None
        except ValueError as error:
            raise ValueError(f"{path}: {error}") from None

    def to_hf(self) -> dict:
        """The same model as a Hugging Face ``LlamaConfig`` dict (used by parity tests)."""
        hf = {
            "model_type": "llama",
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
            "hidden_act": "silu",
        }
        if self.rope_scaling:
            hf["rope_scaling"] = dict(self.rope_scaling)
        return hf

    def num_parameters(self) -> int:
        """Parameter count from the config alone (embeddings counted once when tied)."""
        d, h = self.hidden_size, self.head_dim
        attn = d * h * (self.num_heads + 2 * self.num_kv_heads) + self.num_heads * h * d
        mlp = 3 * d * self.intermediate_size
        per_layer = attn + mlp + 2 * d
        embed = self.vocab_size * d * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * per_layer + embed + d

    def as_dict(self) -> dict:
        return asdict(self)
