"""EAGLE-style draft heads: one decoder block over the target's hidden states guessing
the next tokens for speculative decoding (:mod:`.head`), saved and loaded as a small
directory (:mod:`.storage`), over the K tokens the target emits most (:mod:`.vocab`),
trained by self-distillation on the target's own answers (:mod:`.features`,
:mod:`.train`). Served by the engine: ``LLM(model, draft_head=DIR,
scheduler=SchedulerConfig(speculative_tokens=γ))``."""

from .head import DraftHead
from .storage import load_head, save_head

__all__ = ["DraftHead", "load_head", "save_head"]
