"""Text <-> token ids, and the chat template, through the checkpoint's Hugging Face tokenizer.

Tokenization is not what this course is about, so we wrap the real thing instead of
rewriting it. What matters for generation is here: which ids end a reply
(``stop_tokens``: the eos token, the end-of-document token, and for chat models
``<|im_end|>`` or ``<end_of_turn>``, whichever are special tokens of the vocabulary), which
start a document (:meth:`Tokenizer.prompt`: Gemma's BOS) and how a
conversation becomes one prompt (the chat template stored with the checkpoint).
"""

from __future__ import annotations

from pathlib import Path

from .assets import AssetError
from .checkpoint import resolve_checkpoint


class Tokenizer:
    def __init__(self, name_or_path: str | Path = "smollm2"):
        from transformers import AutoTokenizer  # heavy: loaded when a tokenizer is made

        directory = resolve_checkpoint(name_or_path)
        if not (directory / "tokenizer.json").exists() and \
                not (directory / "tokenizer_config.json").exists():
            raise AssetError(f"{directory} has no tokenizer (tokenizer.json); copy the tokenizer "
                             "files of the model it was made from into it")
        self.hf = AutoTokenizer.from_pretrained(directory)
        vocab, special = self.hf.get_vocab(), set(self.hf.all_special_tokens)
        special |= {str(t) for t in self.hf.added_tokens_decoder.values() if t.special}
        stop_names = {"<|im_end|>", "<|endoftext|>", "</s>", "<end_of_turn>"} & special
        self.stop_tokens = sorted(vocab[name] for name in stop_names | {self.hf.eos_token}
                                  if name in vocab)
        pad = self.hf.pad_token_id
        self.pad_id = pad if pad is not None else self.stop_tokens[0]

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    def encode(self, text: str) -> list[int]:
        """The ids of ``text`` alone (no BOS): pieces that are concatenated or scored."""
        return self.hf.encode(text, add_special_tokens=False)

    def prompt(self, text: str) -> list[int]:
        """The ids of ``text`` as the start of a document: with the BOS token for models
        trained with one (Gemma: without it, its continuations change), as is for SmolLM2."""
        return self.hf.encode(text, add_special_tokens=True)

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def chat_prompt(self, user_message: str, system: str | None = None) -> list[int]:
        """Token ids of a one-turn conversation, ending where the assistant starts to speak."""
        messages = [{"role": "system", "content": system}] if system else []
        return self.conversation_prompt([*messages, {"role": "user", "content": user_message}])

    def conversation_prompt(self, messages: list[dict[str, str]]) -> list[int]:
        """Token ids of a conversation (``{"role": ..., "content": ...}`` messages, as in
        OpenAI's chat API) through the checkpoint's chat template, ending where the
        assistant starts to speak."""
        if self.hf.chat_template is None:
            raise ValueError("this checkpoint's tokenizer has no chat template (a base model, "
                             "such as Gemma 3 270M): pass plain text prompts instead of chat "
                             "messages")
        text = self.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return self.encode(text)
