"""Chat prompts of three kinds, for measuring speculative decoding on SmolLM2.

How much a draft can guess depends on the task (Leviathan et al. 2023 §4; Saxena 2023):

* *input-grounded* (rewrite, extract, edit code): the answer copies spans of the prompt,
  which prompt lookup can find and a small model can predict;
* *chat* (an explanation, advice): free text, but in the predictable register of an
  assistant;
* *creative* (a story): the least predictable.

Chat and creative prompts are the *open-ended* ones. The paragraph to rewrite and to
extract from is the start of the first document of the Wikipedia eval split.
"""

from __future__ import annotations

from .data import load_documents
from .tokenizer import Tokenizer

CODE = '''def mean(values):
    total = 0
    for v in values:
        total += v
    return total / len(values) if values else 0.0


def variance(values):
    m = mean(values)
    return sum((v - m) ** 2 for v in values) / len(values)
'''


def task_prompts(tokenizer: Tokenizer) -> list[tuple[str, str, list[int]]]:
    """(kind, name, chat prompt ids) for every prompt, input-grounded first."""
    paragraph = " ".join(load_documents("wikipedia", "eval")[0].split()[:120])
    texts = [
        ("input-grounded", "rewrite",
         f"Rewrite this paragraph in plain words, keeping its facts:\n\n{paragraph}"),
        ("input-grounded", "extract",
         f"List every name, date and number that appears in this text:\n\n{paragraph}"),
        ("input-grounded", "edit code",
         f"Rename the variable `values` to `xs` in this code and return the whole code:\n\n{CODE}"),
        ("chat", "explain", "Explain in a short paragraph why the sky is blue."),
        ("chat", "advice", "How can I get better at learning a new language? Give practical tips."),
        ("creative", "story",
         "Write a short story about a lighthouse keeper who finds a message in a bottle."),
    ]
    return [(kind, name, tokenizer.chat_prompt(text)) for kind, name, text in texts]
