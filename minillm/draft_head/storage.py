"""A draft head on disk: ``head.safetensors`` (its weights and ``vocab``) and
``draft_head.json`` (the target's shape it was made for, K, and how it was trained).

The target's embedding is not in it: the head always runs beside its target, whose
embedding it reads (:mod:`.head`).
"""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import load_file, save_file

from ..assets import minillm_home
from ..config import ModelConfig
from .head import DraftHead

WEIGHTS, CONFIG = "head.safetensors", "draft_head.json"


def default_dir() -> Path:
    """Where ``minillm train-draft-head`` writes SmolLM2's head (and its self-distillation
    data, ``self_distill.pt``) unless told otherwise."""
    return minillm_home() / "draft_heads" / "smollm2-eagle"


def save_head(head: DraftHead, directory: str | Path, training: dict | None = None) -> Path:
    """Write ``head`` to ``directory`` (made if needed); ``training``: what to record about
    how it was made (steps, loss, ...). Returns the directory."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().contiguous() for name, t in head.state_dict().items()}
    save_file(tensors, directory / WEIGHTS)
    config = {"model": head.config.as_dict(), "num_tokens": head.num_tokens,
              "training": training or {}}
    (directory / CONFIG).write_text(json.dumps(config, indent=2))
    return directory


def load_head(directory: str | Path) -> DraftHead:
    """The head saved in ``directory`` by :func:`save_head`, in eval mode."""
    directory = Path(directory)
    if not (directory / CONFIG).exists():
        raise FileNotFoundError(f"no draft head in {directory} (no {CONFIG}): make one with "
                                "`minillm train-draft-head --out DIR`")
    config = json.loads((directory / CONFIG).read_text())
    tensors = load_file(directory / WEIGHTS)
    head = DraftHead(ModelConfig(**config["model"]), tensors["vocab"])
    head.load_state_dict(tensors)
    return head.eval()


def size_on_disk(directory: str | Path) -> int:
    """Bytes of the head's two files."""
    return sum((Path(directory) / name).stat().st_size for name in (WEIGHTS, CONFIG))
