"""Self-distillation data for a draft head: chat prompts, and the target's features over
its own answers.

The head must guess what *this* target says, so it learns from the target's answers
(EAGLE's self-distillation): chat prompts are built from the course's corpora (the train
split for training, the eval split held out), the engine answers them (the caller does
that: :mod:`minillm.experiments.self_distillation`), and one teacher-forced pass of the target over
prompt + answer gives, at every answer position, the final hidden state f_t (before the
norm) that the head reads and whose logits it learns to match.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from ..data import load_documents
from ..model import Transformer

TEMPLATES = (
    "Summarize this text in two or three sentences:\n\n{text}",
    "Explain the main idea of this text to a student:\n\n{text}",
    "What questions would a curious reader ask after reading this? Answer one of them.\n\n{text}",
    "Rewrite this in plain, simple words:\n\n{text}",
    "Write a short story inspired by this text:\n\n{text}",
    "Give practical advice to someone who wants to learn more about this topic:\n\n{text}",
    "List the key facts in this text as bullet points:\n\n{text}",
    "Is there anything surprising in this text? Explain why in a short paragraph.\n\n{text}",
)
CORPORA = ("wikipedia", "sotu", "shakespeare")


def chat_prompts(tokenizer, count: int, split: str = "train", seed: int = 0,
                 words: int = 60) -> list[list[int]]:
    """``count`` chat prompts (token ids): a template over an excerpt of ``words`` words of a
    document of the ``split`` ("train" or "eval", disjoint) of the course's corpora."""
    rng = random.Random(seed)
    documents = [doc for name in CORPORA for doc in load_documents(name, split)
                 if len(doc.split()) >= words]
    prompts = []
    for _ in range(count):
        words_of = rng.choice(documents).split()
        start = rng.randrange(len(words_of) - words + 1)
        text = " ".join(words_of[start:start + words])
        prompts.append(tokenizer.chat_prompt(rng.choice(TEMPLATES).format(text=text)))
    return prompts


@dataclass
class Answer:
    """One answer as the head sees it: ``tokens`` x_P .. x_{T-1} (the answer, from position
    ``start`` = P) and ``features`` f_{P-1} .. f_{T-1} [len(tokens) + 1, hidden]: the
    target's final hidden states, the first at the prompt's last token."""

    start: int
    tokens: torch.Tensor
    features: torch.Tensor


@torch.inference_mode()
def final_hidden(target: Transformer, tokens: list[int]) -> torch.Tensor:
    """The target's final hidden states (before the norm) over ``tokens`` [T, hidden]."""
    ids = torch.tensor([tokens], device=target.device)
    inputs = target.layer_inputs(len(tokens), target.device)
    return target.run_layers(target.embed(ids), inputs)[0].float()


def teacher_answers(target: Transformer, prompts: list[list[int]], answers: list[list[int]],
                    progress: bool = True) -> list[Answer]:
    """One teacher-forced pass of ``target`` over each prompt + answer (empty answers
    skipped)."""
    out = []
    pairs = [(p, a) for p, a in zip(prompts, answers, strict=True) if a]
    for prompt, answer in tqdm(pairs, desc="target features", disable=not progress):
        hidden = final_hidden(target, prompt + answer)
        out.append(Answer(len(prompt), torch.tensor(answer), hidden[len(prompt) - 1:].clone()))
    return out


@torch.inference_mode()
def target_logits(target: Transformer, features: torch.Tensor,
                  vocab: torch.Tensor | None = None) -> torch.Tensor:
    """The target's logits from its features (its norm and head), over ``vocab``'s rows
    only when given: [..., hidden] -> [..., K or vocab]."""
    weight = target.lm_head.weight.float()
    weight = weight if vocab is None else weight[vocab]
    return target.norm(features) @ weight.T
