"""Perplexity: how surprised a model is by real text, exp(mean negative log-likelihood).

A model has a finite context, so long text is cut into windows of ``window`` tokens.

* **Non-overlapping** (``stride=None``): windows side by side; every token except each
  window's first is scored. Fast, but tokens early in a window see little context.
* **Strided** (``stride < window``): windows overlap; each scores only its last
  ``stride`` tokens, which all see at least ``window - stride`` tokens of context. Slower,
  closer to the model's true quality. (Hugging Face's "perplexity of fixed-length models".)

``attention_window`` restricts attention inside each window to the last that-many
tokens (what a sliding-window KV cache does), to measure what the window costs.

Perplexity depends on the text *and* on how it is cut: which documents, how long the
windows, how much they overlap. Two numbers are comparable only when all of these agree, so
the course measures every model on one named :class:`EvalSlice`, :data:`WIKI_EVAL`
(:data:`WIKI_EVAL_SHORT` where a chapter evaluates many models and needs the time), with
:func:`evaluate`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from .data import load_text
from .kv_cache import SlidingWindowKVCache


@dataclass(frozen=True)
class Window:
    begin: int  # first token fed to the model
    end: int  # one past the last token fed
    num_scored: int  # how many of the last tokens are scored (predicted from the ones before)


@dataclass(frozen=True)
class PerplexityResult:
    perplexity: float
    mean_nll: float  # nats per token
    num_tokens: int  # tokens scored
    num_windows: int


def make_windows(num_tokens: int, window: int, stride: int | None = None) -> list[Window]:
    """The windows to score ``num_tokens`` tokens; each token is scored at most once."""
    if window < 2:
        raise ValueError(f"window must be at least 2 tokens, got {window}")
    stride = window if stride is None else stride
    if not 0 < stride <= window:
        raise ValueError(f"stride must be in [1, window={window}], got {stride}")
    windows, scored_until = [], 1  # token 0 has no context: it is never scored
    for begin in range(0, num_tokens - 1, stride):
        end = min(begin + window, num_tokens)
        num_scored = end - max(scored_until, begin + 1)
        if num_scored > 0:
            windows.append(Window(begin, end, num_scored))
            scored_until = end
        if end == num_tokens:
            break
    return windows


def window_nll(logits: torch.Tensor, tokens: torch.Tensor, num_scored: int) -> torch.Tensor:
    """Summed NLL (float64) of the last ``num_scored`` tokens of each row of ``tokens``.

    ``logits[:, t]`` predicts ``tokens[:, t + 1]``.
    """
    predictions = logits[:, -num_scored - 1:-1].double()
    targets = tokens[:, -num_scored:]
    return F.cross_entropy(predictions.flatten(0, 1), targets.flatten(), reduction="sum")


@torch.inference_mode()
def perplexity(model, tokens, window: int = 512, stride: int | None = None,
               batch_size: int = 4, attention_window: int | None = None,
               max_windows: int | None = None, progress: bool = True) -> PerplexityResult:
    """Perplexity of ``model`` on ``tokens`` (a 1-D tensor or list of ids)."""
    tokens = torch.as_tensor(tokens, dtype=torch.long).flatten()
    windows = make_windows(len(tokens), window, stride)[:max_windows]
    if not windows:
        raise ValueError(f"need at least 2 tokens to compute perplexity, got {len(tokens)}")
    total_nll, total_scored = 0.0, 0
    device = model.device
    groups = _same_shape_groups(windows, batch_size)
    for group in tqdm(groups, desc="perplexity", disable=not progress, unit="batch"):
        batch = torch.stack([tokens[w.begin:w.end] for w in group]).to(device)
        cache = None
        if attention_window is not None:
            cache = SlidingWindowKVCache(model.config, len(group), attention_window,
                                         model.dtype, device)
        logits = model(batch, cache)
        total_nll += window_nll(logits, batch, group[0].num_scored).item()
        total_scored += group[0].num_scored * len(group)
    mean = total_nll / total_scored
    return PerplexityResult(math.exp(mean), mean, total_scored, len(windows))


def _same_shape_groups(windows: list[Window], batch_size: int) -> list[list[Window]]:
    """Batch consecutive windows that have the same length and number of scored tokens."""
    groups: list[list[Window]] = []
    for w in windows:
        last = groups[-1] if groups else None
        if (last and len(last) < batch_size and last[0].num_scored == w.num_scored
                and last[0].end - last[0].begin == w.end - w.begin):
            last.append(w)
        else:
            groups.append([w])
    return groups


@dataclass(frozen=True)
class EvalSlice:
    """A fixed piece of a corpus split that every chapter measures perplexity on.

    The split's text (:func:`minillm.data.load_text`) is tokenized and cut into consecutive
    windows of ``window`` tokens; the slice keeps ``num_windows`` of them, evenly spaced from
    the first, so it samples the whole split (every article, not the first one or two) at
    the cost of a few windows. Windows do not overlap (stride = window): each window's first
    token is not scored, the other ``window - 1`` are.
    """

    name: str
    corpus: str
    split: str
    window: int
    num_windows: int

    @property
    def num_tokens(self) -> int:
        return self.window * self.num_windows

    def describe(self) -> str:
        return (f"{self.name}: {self.corpus} {self.split} split, {self.num_windows} windows of "
                f"{self.window} tokens evenly spaced ({self.num_tokens:,} tokens), no overlap")


# The course's evaluation: every perplexity of a full model is measured on this slice.
WIKI_EVAL = EvalSlice("wiki-eval-8x512", "wikipedia", "eval", window=512, num_windows=8)
# Half of WIKI_EVAL's windows (every second one), for chapters that evaluate many variants.
WIKI_EVAL_SHORT = EvalSlice("wiki-eval-4x512", "wikipedia", "eval", window=512, num_windows=4)


def eval_tokens(tokenizer, eval_slice: EvalSlice = WIKI_EVAL) -> torch.Tensor:
    """The slice's tokens, its windows one after another: a LongTensor [num_windows * window].

    Window ``i`` is window number ``i * available // num_windows`` of the split, so a slice
    with half as many windows keeps every second window of the larger one.
    """
    tokens = torch.tensor(tokenizer.encode(load_text(eval_slice.corpus, eval_slice.split)))
    available = len(tokens) // eval_slice.window
    if available < eval_slice.num_windows:
        raise ValueError(f"{eval_slice.name} needs {eval_slice.num_windows} windows of "
                         f"{eval_slice.window} tokens; the split has {available}")
    windows = tokens[:available * eval_slice.window].view(available, eval_slice.window)
    picked = [i * available // eval_slice.num_windows for i in range(eval_slice.num_windows)]
    return windows[picked].flatten()


def evaluate(model, tokenizer, eval_slice: EvalSlice = WIKI_EVAL, **options) -> PerplexityResult:
    """Perplexity of ``model`` on ``eval_slice``: :func:`perplexity` on :func:`eval_tokens`
    with the slice's window, no overlap. ``options`` go to :func:`perplexity`
    (``batch_size``, ``attention_window``, ``progress``)."""
    return perplexity(model, eval_tokens(tokenizer, eval_slice), window=eval_slice.window,
                      **options)
