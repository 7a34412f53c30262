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

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
from tqdm.auto import tqdm

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


# -- training a student on precomputed teacher distributions ---------------------------


@dataclass
class TeacherTargets:
    """The teacher's top-k logits at every position of some windows of text.

    Storing all 49,152 logits per position costs 96 KB in fp16 (20 GB for 200k tokens); the
    top 64 cost 384 bytes. The soft target is the teacher's distribution renormalised over
    its top k (the rest of its mass — a few percent at k = 64 — is dropped), which supports
    the forward KL and total variation (not the reverse KL, which needs p everywhere).
    """

    tokens: torch.Tensor  # [windows, seq] token ids
    values: torch.Tensor  # [windows, seq, k] fp16 logits
    indices: torch.Tensor  # [windows, seq, k] token ids of those logits


@torch.inference_mode()
def teacher_targets(teacher, windows: torch.Tensor, k: int = 64, batch_size: int = 4,
                    progress: bool = True) -> TeacherTargets:
    """Run the teacher once over ``windows`` [n, seq] and keep its top-k logits."""
    values, indices = [], []
    for chunk in tqdm(windows.split(batch_size), desc="teacher", disable=not progress):
        top = teacher(chunk).topk(k, dim=-1)
        values.append(top.values.half())
        indices.append(top.indices.int())
    return TeacherTargets(windows, torch.cat(values), torch.cat(indices))


def sparse_kd_loss(student_logits: torch.Tensor, values: torch.Tensor, indices: torch.Tensor,
                   targets: torch.Tensor, *, alpha: float = 0.5, temperature: float = 2.0,
                   kind: str = "forward") -> torch.Tensor:
    """:func:`kd_loss` with the teacher given by its top-k logits (see :class:`TeacherTargets`);
    all positions count. ``kind``: "forward" or "tv"."""
    if kind not in ("forward", "tv"):
        raise ValueError(f"top-k soft targets support 'forward' and 'tv', not {kind!r}")
    log_p = F.log_softmax(values.float() / temperature, dim=-1)
    log_q_all = F.log_softmax(student_logits.float() / temperature, dim=-1)
    log_q = log_q_all.gather(-1, indices.long())
    if kind == "forward":
        soft = (log_p.exp() * (log_p - log_q)).sum(-1)
    else:  # mass of q outside the teacher's top k counts fully: p is 0 there
        q = log_q.exp()
        soft = 0.5 * ((log_p.exp() - q).abs().sum(-1) + (1 - q.sum(-1)).clamp(min=0))
    hard = F.cross_entropy(student_logits.flatten(0, -2).float(), targets.flatten(),
                           reduction="none").view_as(soft)
    return (alpha * temperature**2 * soft + (1 - alpha) * hard).mean()


@dataclass
class DistillConfig:
    steps: int = 500
    batch_size: int = 4
    lr: float = 3e-4
    alpha: float = 0.9
    temperature: float = 2.0
    kind: str = "forward"
    seed: int = 0
    checkpoint_every: int = 100


def top1_agreement(student, teacher_indices: torch.Tensor, tokens: torch.Tensor,
                   batch_size: int = 4) -> float:
    """How often the student's greedy token is the teacher's (its top-1 logit), over every
    position of ``tokens`` [n, seq]: the acceptance rate of greedy speculative decoding."""
    agree = 0
    with torch.inference_mode():
        for chunk, best in zip(tokens.split(batch_size), teacher_indices[..., 0].split(batch_size),
                               strict=True):
            agree += int((student(chunk).argmax(-1) == best).sum())
    return agree / tokens.numel()


def distill(student, data: TeacherTargets, config: DistillConfig,
            resume_file: str | Path | None = None, progress: bool = True,
            loss=sparse_kd_loss, after_step: Callable[[], None] | None = None) -> list[float]:
    """Train ``student`` on ``data`` with AdamW; returns the loss of every step.

    ``loss`` has :func:`sparse_kd_loss`'s signature (chapter 10 passes the learner's own).
    ``after_step()`` runs after every optimizer step: a pruned student puts its zeros back
    there (:func:`minillm.quant.sparsity.zeros_keeper`), so it stays pruned while it learns.
    Batches are drawn with a generator seeded by ``config.seed``. With ``resume_file`` the
    student, the optimizer and the step are saved there every ``checkpoint_every`` steps,
    and a run that finds the file resumes where it stopped (the same batches follow).
    """
    student.train()
    optimizer = torch.optim.AdamW([p for p in student.parameters() if p.requires_grad],
                                  lr=config.lr)
    generator = torch.Generator().manual_seed(config.seed)
    order = [torch.randint(0, len(data.tokens), (config.batch_size,), generator=generator)
             for _ in range(config.steps)]
    start, losses = 0, []
    if resume_file is not None and Path(resume_file).exists():
        state = torch.load(resume_file, weights_only=False)
        student.load_state_dict(state["student"])
        optimizer.load_state_dict(state["optimizer"])
        start, losses = state["step"], state["losses"]
    for step in tqdm(range(start, config.steps), desc="distill", disable=not progress,
                     initial=start, total=config.steps):
        rows = order[step]
        tokens = data.tokens[rows]
        logits = student(tokens[:, :-1])
        step_loss = loss(logits, data.values[rows, :-1], data.indices[rows, :-1],
                         tokens[:, 1:], alpha=config.alpha, temperature=config.temperature,
                         kind=config.kind)
        optimizer.zero_grad()
        step_loss.backward()
        optimizer.step()
        if after_step is not None:
            after_step()
        losses.append(step_loss.item())
        if resume_file is not None and (step + 1) % config.checkpoint_every == 0:
            torch.save({"student": student.state_dict(), "optimizer": optimizer.state_dict(),
                        "step": step + 1, "losses": losses}, resume_file)
    student.eval()
    return losses
