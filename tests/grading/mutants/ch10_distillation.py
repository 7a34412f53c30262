"""Plausible wrong answers to chapter 10 (knowledge distillation); the graded tests must catch
each one. Each mutant replaces the solution function named before its ``__``."""

import torch
import torch.nn.functional as F


def _kd(student, teacher, y, alpha, t, *, t_squared=True, reverse=False, student_t=True):
    log_p = F.log_softmax(teacher.float() / t, dim=-1)
    log_q = F.log_softmax(student.float() / (t if student_t else 1.0), dim=-1)
    kl = ((log_q.exp() * (log_q - log_p)) if reverse else (log_p.exp() * (log_p - log_q))).sum(-1)
    ce = F.cross_entropy(student.float(), y, reduction="none")
    return alpha * (t * t if t_squared else 1.0) * kl + (1 - alpha) * ce


def kd_loss__no_t_squared(student_logits, teacher_logits, targets, mask, alpha, temperature):
    """Forgets T²: the soft term's gradients shrink as 1/T²."""
    m = mask
    return _kd(student_logits[m], teacher_logits[m], targets[m], alpha, temperature,
               t_squared=False).mean()


def kd_loss__kl_div_arguments_swapped(student_logits, teacher_logits, targets, mask, alpha,
                                      temperature):
    """F.kl_div(teacher_log_probs, student_probs): KL(q ‖ p), the reverse divergence."""
    m = mask
    return _kd(student_logits[m], teacher_logits[m], targets[m], alpha, temperature,
               reverse=True).mean()


def kd_loss__batchmean(student_logits, teacher_logits, targets, mask, alpha, temperature):
    """Divides the sum over real tokens by the batch size (kl_div's "batchmean" on [B, T, V])."""
    m = mask
    terms = _kd(student_logits[m], teacher_logits[m], targets[m], alpha, temperature)
    return terms.sum() / student_logits.shape[0]


def kd_loss__padding_counted(student_logits, teacher_logits, targets, mask, alpha, temperature):
    """Averages over every position, padding included."""
    vocab = student_logits.shape[-1]
    return _kd(student_logits.reshape(-1, vocab), teacher_logits.reshape(-1, vocab),
               targets.reshape(-1), alpha, temperature).mean()


def kd_loss__student_not_softened(student_logits, teacher_logits, targets, mask, alpha,
                                  temperature):
    """Divides only the teacher's logits by T."""
    m = mask
    return _kd(student_logits[m], teacher_logits[m], targets[m], alpha, temperature,
               student_t=False).mean()


def sparse_kd_loss__student_softmax_over_top_k(student_logits, values, indices, targets, *,
                                               alpha=0.5, temperature=2.0, kind="forward"):
    """Normalises the student over the teacher's k tokens only: its mass elsewhere goes
    unpunished."""
    log_p = F.log_softmax(values.float() / temperature, dim=-1)
    picked = student_logits.float().gather(-1, indices.long())
    log_q = F.log_softmax(picked / temperature, dim=-1)
    soft = (log_p.exp() * (log_p - log_q)).sum(-1)
    hard = F.cross_entropy(student_logits.flatten(0, -2).float(), targets.flatten(),
                           reduction="none").view_as(soft)
    return (alpha * temperature**2 * soft + (1 - alpha) * hard).mean()


def sparse_kd_loss__hard_label_from_the_teacher(student_logits, values, indices, targets, *,
                                                alpha=0.5, temperature=2.0, kind="forward"):
    """Uses the teacher's top-1 token as the hard label instead of the text's next token."""
    log_p = F.log_softmax(values.float() / temperature, dim=-1)
    log_q = F.log_softmax(student_logits.float() / temperature, dim=-1).gather(-1, indices.long())
    soft = (log_p.exp() * (log_p - log_q)).sum(-1)
    hard = F.cross_entropy(student_logits.flatten(0, -2).float(), indices[..., 0].flatten().long(),
                           reduction="none").view_as(soft)
    return (alpha * temperature**2 * soft + (1 - alpha) * hard).mean()


def sparse_kd_loss__teacher_not_softened(student_logits, values, indices, targets, *,
                                         alpha=0.5, temperature=2.0, kind="forward"):
    """Softens the student but takes the teacher's top-k softmax at temperature 1."""
    log_p = F.log_softmax(values.float(), dim=-1)
    log_q = F.log_softmax(student_logits.float() / temperature, dim=-1).gather(-1, indices.long())
    soft = (log_p.exp() * (log_p - log_q)).sum(-1)
    hard = F.cross_entropy(student_logits.flatten(0, -2).float(), targets.flatten(),
                           reduction="none").view_as(soft)
    return (alpha * temperature**2 * soft + (1 - alpha) * hard).mean()


def total_variation__no_half(teacher_logits, student_logits, temperature=1.0):
    """The L1 distance Σ |p − q| (twice TV, up to 2)."""
    p = F.softmax(teacher_logits.float() / temperature, dim=-1)
    q = F.softmax(student_logits.float() / temperature, dim=-1)
    return (p - q).abs().sum(-1)


def total_variation__ignores_temperature(teacher_logits, student_logits, temperature=1.0):
    """Compares the distributions at T = 1 whatever T is asked for."""
    p, q = F.softmax(teacher_logits.float(), -1), F.softmax(student_logits.float(), -1)
    return 0.5 * (p - q).abs().sum(-1)


def greedy_agreement__mask_ignored(student_logits, teacher_logits, mask):
    """Counts padded positions too."""
    return float((student_logits.argmax(-1) == teacher_logits.argmax(-1)).float().mean())


def greedy_agreement__mean_of_rows(student_logits, teacher_logits, mask):
    """Averages each row's agreement, so a short row weighs as much as a long one."""
    same = (student_logits.argmax(-1) == teacher_logits.argmax(-1)).float()
    rows = [same[i][mask[i]].mean() for i in range(len(same)) if mask[i].any()]
    return float(torch.stack(rows).mean())


def greedy_agreement__last_index_on_ties(student_logits, teacher_logits, mask):
    """Breaks ties towards the last index (argmax of the flipped vector), unlike ``argmax``."""
    vocab = student_logits.shape[-1]
    s = vocab - 1 - student_logits.flip(-1).argmax(-1)
    t = vocab - 1 - teacher_logits.flip(-1).argmax(-1)
    return float((s == t)[mask].float().mean())
