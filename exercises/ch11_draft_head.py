# Generated from solutions/ch11_draft_head.py by `python -m minillm.grading.exercises`.
# Fill in the parts that raise NotImplementedError; do not edit the rest.
"""Chapter 11, the draft head's training: the loss over the head's K tokens, the attention
mask of a chain of guesses, and one unrolled training step (EAGLE-3's training-time test).

The head (:mod:`minillm.draft_head`) reads [f_{t-1} ; e(x_t)], runs one decoder block and
outputs logits over the K tokens of ``head.vocab``. ``minillm.draft_head.train.train_head``
trains it with any step that has :func:`train_step`'s signature: ``train_head(...,
step=train_step)`` runs yours.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minillm.draft_head import features as target_features
from minillm.draft_head.head import DraftHead
from minillm.draft_head.train import CLIP_NORM, Batch
from minillm.model import Transformer


def restricted_kl(target_logits: torch.Tensor, head_logits: torch.Tensor, vocab: torch.Tensor,
                  valid: torch.Tensor) -> torch.Tensor:
    """Exercise 11.6: The head's loss: KL from the target's distribution over the K tokens.

    ``target_logits`` [..., V]: the target's logits over its whole vocabulary at each
    position; ``head_logits`` [..., K]: the head's, whose column k stands for the target's
    token ``vocab[k]`` (``vocab`` [K] int64: distinct ids, in any order); ``valid`` [...]
    bool, the positions that count (at least one). p_K is the target's distribution over
    the K tokens alone, renormalised: a token outside ``vocab`` can never be proposed, so
    its mass is dropped. q = softmax(head_logits). Returns the mean over the valid
    positions of the forward KL(p_K || q) = Σ_k p_K(k) (log p_K(k) − log q(k)): a 0-dim
    tensor in the inputs' dtype, differentiable in ``head_logits`` (Li et al. 2024, EAGLE;
    Zhao et al. 2025, FR-Spec for the K tokens).
    """
    raise NotImplementedError("Exercise 11.6: The head's loss: KL from the target's distribution over the K tokens")


def unrolled_mask(length: int, step: int) -> torch.Tensor:
    """Exercise 11.7: Which keys the queries of unrolled pass ``step`` may attend to.

    Training runs ``step`` = 1, 2, ... passes of the head over every answer index t =
    0..length − 1 at once. Pass 1 at t is the head reading the target's feature there; pass
    s > 1 at t plays the s-th guess of a chain that started after index t − s + 1: that
    guess could see the target-fed keys of pass 1 at indices 0..t − s + 1, then the key of
    each earlier guess of its chain (pass j at index t − s + j, j = 2..s − 1), and its own
    (pass s at t). Returns a bool tensor [length, step · length]: row t, column
    (j − 1) · length + i is True iff pass ``step``'s query at t may see pass j's key at i.
    ``step`` >= 1; rows with t < step − 1 (no such chain) still see at least their own key.
    """
    raise NotImplementedError("Exercise 11.7: Which keys the queries of unrolled pass ``step`` may attend to")


def train_step(head: DraftHead, target: Transformer, batch: Batch,
               optimizer: torch.optim.Optimizer, depth: int) -> float:
    """Exercise 11.8: One training step of the draft head, unrolled over its own guesses.

    ``batch`` (:class:`minillm.draft_head.train.Batch`) holds B answers padded to L tokens:
    ``features`` [B, L + 1, hidden] the target's final hidden states f_{P−1} .. f_{P+L−1},
    ``tokens`` [B, L] the answer x_P .., ``positions`` [B, L] (theirs, for RoPE), ``real``
    [B, L] (False: padding). Pass s = 1..``depth`` runs the head over all L indices at once:

    * its input at index t is [feature ; e(x_t)], e = ``target.embed_tokens`` (as float);
      pass 1's feature is the target's f_{t−1}; pass s > 1's is the head's own output at
      t − 1 from pass s − 1 (zeros at t = 0), gradients flowing back through it;
    * its queries attend over the keys and values of passes 1..s as :func:`unrolled_mask`
      says (``head.project`` -> x, q, k, v; ``head.finish(x, q, keys, values, mask)`` -> g,
      the pass's output; ``head.logits(g)`` -> [B, L, K]);
    * its loss is :func:`restricted_kl` against the target's logits at f_t
      (``minillm.draft_head.features.target_logits``), over the real indices t >= s − 1.

    The step's loss is the mean of the ``depth`` pass losses. Then one update of the head
    by ``optimizer`` (any torch optimizer over the head's parameters), from gradients of
    this loss alone, their global norm clipped to ``CLIP_NORM``; the target is frozen
    (nothing of it gets a gradient or changes). Returns the loss as a float. Equal, to
    1e-5, to ``minillm.draft_head.train.train_step`` (EAGLE-3, Li et al. 2025, the
    "training-time test"; the module docstring of ``minillm.draft_head.train``).
    """
    raise NotImplementedError("Exercise 11.8: One training step of the draft head, unrolled over its own guesses")
