"""Training a draft head on the target's own answers, unrolled as it is used (EAGLE-3).

At inference the head reads the target's feature only for its first guess; guess s reads
the head's own feature from guess s - 1. Training only on target features would teach a
head that has never seen its own (EAGLE-3's "training-time test", Li et al. 2025), so every
batch runs ``depth`` unrolled passes over each answer:

* pass 1 at position t reads [f_{t-1} ; e(x_t)] (the target's feature) and attends over
  pass 1's keys at positions <= t;
* pass s reads [g^{(s-1)}_{t-1} ; e(x_t)] (the head's own feature from pass s - 1) and
  attends, as guess s would, over pass 1's keys at positions <= t - s + 1 and pass j's key
  at position t - s + j for j = 2..s (the chain of guesses before it).

The head's history starts at the answer's first token (the prompt's features are not
read: the engine's runner returns features at logits rows only,
:mod:`minillm.engine.head_proposer`).

Loss: the forward KL from the target's next-token distribution restricted to the head's K
tokens and renormalised, p_K = softmax(W_K · norm(f_t)), to the head's q, at every pass
and position. The soft target says how much the target likes each of the K tokens, not
only which it picked: more signal per answer token than cross-entropy on the token (the
few minutes of training are data-starved), and what acceptance under sampling depends on
(min(p, q) summed); for greedy decoding p_K's argmax is the target's whenever that token
is among the K at all. Tokens outside the K cannot be proposed, so their mass is dropped.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..model import Transformer
from .features import Answer, target_logits
from .head import DraftHead

CLIP_NORM = 1.0  # the gradients' global norm, at most


@dataclass
class TrainConfig:
    steps: int = 300
    batch_size: int = 4  # answers per step
    depth: int = 3  # unrolled passes (guesses trained for)
    lr: float = 3e-4
    max_len: int = 160  # answer tokens per answer, at most
    seed: int = 0


@dataclass
class Batch:
    """Answers padded to one length L: features f_{P-1} .. [B, L + 1, hidden], tokens [B, L],
    positions [B, L] (of the tokens), real [B, L] (False: padding)."""

    features: torch.Tensor
    tokens: torch.Tensor
    positions: torch.Tensor
    real: torch.Tensor


def make_batch(answers: list[Answer], max_len: int) -> Batch:
    length = min(max_len, max(len(a.tokens) for a in answers))
    hidden = answers[0].features.shape[-1]
    features = torch.zeros(len(answers), length + 1, hidden)
    tokens = torch.zeros(len(answers), length, dtype=torch.long)
    real = torch.zeros(len(answers), length, dtype=torch.bool)
    for i, answer in enumerate(answers):
        n = min(length, len(answer.tokens))
        features[i, :n + 1], tokens[i, :n], real[i, :n] = (
            answer.features[:n + 1], answer.tokens[:n], True)
    positions = torch.tensor([a.start for a in answers])[:, None] + torch.arange(length)
    return Batch(features, tokens, positions, real)


TrainStep = Callable[[DraftHead, Transformer, Batch, torch.optim.Optimizer, int], float]


def unrolled_mask(length: int, step: int) -> torch.Tensor:
    """Which keys pass ``step`` (1-based) queries see at each answer index: [L, step · L],
    the keys of passes 1..step side by side (see the module docstring)."""
    t = torch.arange(length)[:, None]
    s = torch.arange(length)[None, :]
    parts = [s <= t - step + 1] + [s == t - step + j for j in range(2, step + 1)]
    return torch.cat(parts, dim=1)  # the diagonal (the query's own key) is always in


def distillation_kl(teacher_logits: torch.Tensor, head_logits: torch.Tensor,
                    valid: torch.Tensor) -> torch.Tensor:
    """KL(p_K || q) averaged over the ``valid`` positions [...]: p_K = softmax of the target's
    logits at the head's K tokens ``teacher_logits`` [..., K] (so renormalised over them),
    q = softmax(``head_logits``) [..., K], column k of both being token vocab[k]."""
    teacher = F.log_softmax(teacher_logits, -1)
    log_q = F.log_softmax(head_logits, -1)
    return (teacher.exp() * (teacher - log_q)).sum(-1)[valid].mean()


def unrolled_loss(head: DraftHead, target: Transformer, batch: Batch, depth: int
                  ) -> tuple[torch.Tensor, list[float]]:
    """The mean over the ``depth`` passes of each pass's mean KL over its real positions,
    and each pass's top-1 agreement with p_K's argmax."""
    embeddings = target.embed_tokens(batch.tokens).float().detach()
    with torch.no_grad():
        teacher = target_logits(target, batch.features[:, 1:], head.vocab)
    features, keys, values = batch.features[:, :-1], [], []
    losses, agreement = [], []
    length = batch.tokens.shape[1]
    for step in range(1, depth + 1):
        x, q, k, v = head.project(features, embeddings, batch.positions)
        keys.append(k)
        values.append(v)
        mask = unrolled_mask(length, step)
        g = head.finish(x, q, torch.cat(keys, -2), torch.cat(values, -2), mask)
        logits = head.logits(g)
        valid = batch.real.clone()
        valid[:, :step - 1] = False  # no chain of step - 1 guesses before these
        losses.append(distillation_kl(teacher, logits, valid))
        agreement.append(float((logits.argmax(-1) == teacher.argmax(-1))[valid].float().mean()))
        features = torch.cat([torch.zeros_like(g[:, :1]), g[:, :-1]], dim=1)  # g_{t-1} at t
    return torch.stack(losses).mean(), agreement


def train_step(head: DraftHead, target: Transformer, batch: Batch,
               optimizer: torch.optim.Optimizer, depth: int) -> float:
    """One optimizer step of ``head`` on ``batch``: the unrolled loss, its gradients (the
    global norm clipped to :data:`CLIP_NORM`), the update. Returns the loss. The seam the
    chapter 11 lab fills (``train_head(step=...)``)."""
    optimizer.zero_grad()
    loss, _ = unrolled_loss(head, target, batch, depth)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(head.parameters(), CLIP_NORM)
    optimizer.step()
    return float(loss.detach())


def train_head(head: DraftHead, target: Transformer, answers: list[Answer],
               config: TrainConfig, progress: bool = True, step: TrainStep = train_step
               ) -> list[float]:
    """Train ``head`` in place on ``answers`` (AdamW, cosine decay), one ``step`` per batch;
    the target stays frozen. Returns the loss of every step."""
    if not answers:
        raise ValueError("no answers to train on")
    rng = random.Random(config.seed)
    torch.manual_seed(config.seed)
    head.train()
    optimizer = torch.optim.AdamW(head.parameters(), lr=config.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda i: 0.5 * (1 + math.cos(math.pi * i / config.steps)))
    losses = []
    bar = tqdm(range(config.steps), desc="draft head", disable=not progress)
    for _ in bar:
        batch = make_batch(rng.sample(answers, min(config.batch_size, len(answers))),
                           config.max_len)
        losses.append(step(head, target, batch, optimizer, config.depth))
        schedule.step()
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    head.eval()
    return losses


@torch.no_grad()
def evaluate(head: DraftHead, target: Transformer, answers: list[Answer], depth: int,
             max_len: int = 160) -> dict:
    """Held-out loss and per-pass top-1 agreement with the target's K-restricted argmax."""
    losses, agreements = [], []
    for i in range(0, len(answers), 8):
        loss, agreement = unrolled_loss(head, target, make_batch(answers[i:i + 8], max_len),
                                        depth)
        losses.append(float(loss.detach()))
        agreements.append(agreement)
    return {"loss": sum(losses) / len(losses),
            "top1_per_guess": [sum(a[s] for a in agreements) / len(agreements)
                               for s in range(depth)]}
