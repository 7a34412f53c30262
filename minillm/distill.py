"""Knowledge distillation: train a small student to match a large teacher's distributions.

A teacher's next-token distribution says more than the one correct token: which other
tokens were plausible, and how much (Hinton et al. 2015's "dark knowledge"). The student
learns from both (Hinton et al. 2015, §2):

    L = α · T² · D(p_T ‖ q_T) + (1 − α) · CE(q, y)

* p_T = softmax(teacher logits / T), q_T = softmax(student logits / T): a temperature
  T > 1 softens both, so the small probabilities carry signal;
* T² keeps the soft term's gradients the same size whatever T is (they shrink as 1/T²);
* CE is the ordinary loss on the true next token y, weighted 1 − α.

The divergence D is a choice (Gu et al. 2024, Agarwal et al. 2024):

* ``"forward"`` KL(p ‖ q): mode-covering, the classic;
* ``"reverse"`` KL(q ‖ p): mode-seeking, the student commits to the teacher's main mode;
* ``"tv"`` total variation ½ Σ |p − q|: speculative decoding accepts a draft token with
  probability 1 − TV(p, q) (Leviathan et al. 2023), so TV is the loss that targets
  acceptance directly.

Every loss here is a mean over real tokens (padding masked), not over batch rows, and is
computed a chunk of positions at a time, each chunk recomputed in the backward pass
(activation checkpointing): the 49,152-way softmaxes of every position of a batch, kept
for backward all at once, would not fit in memory.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

DIVERGENCES = ("forward", "reverse", "tv")


def divergence(teacher_logits: torch.Tensor, student_logits: torch.Tensor, kind: str = "forward",
               temperature: float = 1.0) -> torch.Tensor:
    """D(p_T ‖ q_T) per position: [..., vocab] -> [...]."""
    log_p = F.log_softmax(teacher_logits.float() / temperature, dim=-1)
    log_q = F.log_softmax(student_logits.float() / temperature, dim=-1)
    if kind == "forward":
        return (log_p.exp() * (log_p - log_q)).sum(-1)
    if kind == "reverse":
        return (log_q.exp() * (log_q - log_p)).sum(-1)
    if kind == "tv":
        return 0.5 * (log_p.exp() - log_q.exp()).abs().sum(-1)
    raise ValueError(f"divergence must be one of {', '.join(DIVERGENCES)}, got {kind!r}")


def kd_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor,
            targets: torch.Tensor, mask: torch.Tensor | None = None, *, alpha: float = 0.5,
            temperature: float = 2.0, kind: str = "forward", chunk: int = 256) -> torch.Tensor:
    """α·T²·D(p_T ‖ q_T) + (1 − α)·CE, averaged over the real tokens.

    student_logits, teacher_logits: [batch, seq, vocab]; targets: [batch, seq] next-token
    ids; mask: [batch, seq], True for real tokens (default: all). ``chunk`` positions are
    processed at a time.
    """
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(f"student {tuple(student_logits.shape)} and teacher "
                         f"{tuple(teacher_logits.shape)} logits must have the same shape")
    vocab = student_logits.shape[-1]
    student, teacher = student_logits.reshape(-1, vocab), teacher_logits.reshape(-1, vocab)
    targets = targets.reshape(-1)
    keep = torch.ones_like(targets, dtype=torch.bool) if mask is None else mask.reshape(-1)
    rows = keep.nonzero()[:, 0]
    if rows.numel() == 0:
        raise ValueError("the mask keeps no token")
    def chunk_loss(s: torch.Tensor, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        soft = divergence(t, s, kind, temperature).sum()
        hard = F.cross_entropy(s.float(), y, reduction="sum")
        return alpha * temperature**2 * soft + (1 - alpha) * hard

    total = student.new_zeros((), dtype=torch.float32)
    for part in rows.split(chunk):
        args = (student[part], teacher[part], targets[part])
        if torch.is_grad_enabled() and student.requires_grad:
            total = total + checkpoint(chunk_loss, *args, use_reentrant=False)
        else:
            total = total + chunk_loss(*args)
    return total / rows.numel()
