# Generated from solutions/ch10_distillation.py by `python -m minillm.grading.exercises`.
# Fill in the parts that raise NotImplementedError; do not edit the rest.
"""Chapter 10: knowledge distillation — the KD loss with T², the top-k loss the trainer uses,
total variation (the divergence speculative decoding's acceptance is made of), and the
agreement a draft is judged by."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def kd_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, targets: torch.Tensor,
            mask: torch.Tensor, alpha: float, temperature: float) -> torch.Tensor:
    """Exercise 10.1: The KD loss α·T²·KL(p_T ‖ q_T) + (1 − α)·CE, a mean over real tokens.

    student_logits, teacher_logits: [batch, seq, vocab]; targets: [batch, seq] the true next
    tokens; mask: [batch, seq] bool, True for real tokens (False: padding, which must count
    for nothing). p_T = softmax(teacher / T), q_T = softmax(student / T); the cross-entropy
    is the student's ordinary one (temperature 1) on ``targets``. Returns a 0-dim float32
    tensor: the sum over real tokens divided by their NUMBER (not by the batch size).
    Hint: select the real positions first (``logits[mask]`` is [tokens, vocab]); work in
    float32 with ``log_softmax``.
    """
    raise NotImplementedError("Exercise 10.1: The KD loss α·T²·KL(p_T ‖ q_T) + (1 − α)·CE, a mean over real tokens")


def sparse_kd_loss(student_logits: torch.Tensor, values: torch.Tensor, indices: torch.Tensor,
                   targets: torch.Tensor, *, alpha: float = 0.5, temperature: float = 2.0,
                   kind: str = "forward") -> torch.Tensor:
    """Exercise 10.2: The KD loss with the teacher given by its top-k logits (as trained on).

    student_logits: [batch, seq, vocab]; values, indices: [batch, seq, k] the teacher's k
    largest logits and their token ids; targets: [batch, seq]. Every position is real.
    The soft target p_T is softmax(values / T): the teacher renormalised over its top k.
    The student's log q_T is taken over its WHOLE vocabulary, then read at ``indices``.
    Returns the mean over positions of α·T²·Σ_k p_T (log p_T − log q_T) + (1 − α)·CE.
    ``kind`` is accepted for the library's signature; only "forward" is asked for.
    """
    raise NotImplementedError("Exercise 10.2: The KD loss with the teacher given by its top-k logits (as trained on)")


def total_variation(teacher_logits: torch.Tensor, student_logits: torch.Tensor,
                    temperature: float = 1.0) -> torch.Tensor:
    """Exercise 10.3: Total variation ½ Σ |p − q| between next-token distributions, per position.

    [..., vocab] logits -> [...]; p and q are the softmaxes at ``temperature``.
    Speculative decoding accepts a draft's token with probability 1 − TV(p, q).
    """
    raise NotImplementedError("Exercise 10.3: Total variation ½ Σ |p − q| between next-token distributions, per position")


def greedy_agreement(student_logits: torch.Tensor, teacher_logits: torch.Tensor,
                     mask: torch.Tensor) -> float:
    """Exercise 10.4: How often the student's greedy token is the teacher's, over the real tokens.

    logits [batch, seq, vocab], mask [batch, seq] bool. The fraction of real positions
    where the argmaxes agree (ties: the first index, as ``argmax``), pooled over all real
    positions (not a mean of per-row fractions). This is greedy speculative decoding's
    acceptance rate, teacher-forced.
    """
    raise NotImplementedError("Exercise 10.4: How often the student's greedy token is the teacher's, over the real tokens")
