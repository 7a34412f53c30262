"""Self-distillation data for a draft head, built end to end: chat prompts from the
corpora's train split (and held-out ones from the eval split), the engine's greedy answers
to them, the target's features over prompt + answer (:mod:`minillm.draft_head.features`),
and token counts of corpus text (the tie-break of the head's vocabulary,
:func:`minillm.draft_head.vocab.frequent_tokens`).

``minillm train-draft-head`` builds it from hundreds of long answers and caches it;
chapter 11's lab (:mod:`.draft_head_lab`) builds a dozen short ones in seconds. It lives
here, not in :mod:`minillm.draft_head`, because the answers come from the engine, a layer
above the head's.
"""

from __future__ import annotations

from ..data import load_text
from ..draft_head.features import chat_prompts, teacher_answers
from ..draft_head.vocab import token_counts
from ..model import Transformer
from ..sampling import SamplingParams
from ..serve import LLM, SchedulerConfig
from ..tokenizer import Tokenizer


def answer(model: Transformer, prompts: list[list[int]], tokens: int, stop: list[int],
           progress: bool = True) -> list[list[int]]:
    """Greedy answers of the engine running ``model``, batched, of at most ``tokens``."""
    llm = LLM(model, num_blocks=2048, scheduler=SchedulerConfig(max_batch=16))
    params = SamplingParams(max_tokens=tokens, stop_token_ids=tuple(stop))
    return [o.tokens for o in llm.generate(prompts, params, progress=progress)]


def self_distillation_data(target: Transformer, tokenizer: Tokenizer, prompts: int,
                           eval_prompts: int, answer_tokens: int, seed: int = 0,
                           answering: Transformer | None = None,
                           corpus_chars: int = 2_000_000, progress: bool = True) -> dict:
    """``{"train": [Answer], "eval": [Answer], "corpus_counts": [vocab]}``: ``prompts``
    train and ``eval_prompts`` held-out chat prompts (seeds ``seed`` and ``seed + 1``)
    answered greedily by ``answering`` (default: ``target`` itself; e.g. its W8A8 copy,
    faster), the target's features over them, and token counts of the first
    ``corpus_chars`` characters of Wikipedia's train text."""
    data = {}
    for split, count, split_seed in (("train", prompts, seed), ("eval", eval_prompts, seed + 1)):
        ids = chat_prompts(tokenizer, count, split, split_seed)
        answers = answer(answering or target, ids, answer_tokens, tokenizer.stop_tokens,
                         progress)
        data[split] = teacher_answers(target, ids, answers, progress)
    corpus = tokenizer.encode(load_text("wikipedia", "train")[:corpus_chars])
    data["corpus_counts"] = token_counts([corpus], target.config.vocab_size)
    return data
