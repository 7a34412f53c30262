"""The response bodies, built from text and log-probabilities alone (no engine state):
whole replies (:class:`Reply`, ``best_of``'s ranking), OpenAI's choices for completions
and chat, the usage block, and the server-sent event that carries a streamed chunk."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import NamedTuple

from ...sampling import TokenLogprob


class Piece(NamedTuple):
    """New text of one sample, its finish reason when it ended, and the log-probabilities
    of the tokens consumed since its last piece (empty when not recorded)."""

    index: int
    text: str
    reason: str | None
    logprobs: list[TokenLogprob]


@dataclass
class Reply:
    """One sample's whole reply, gathered from its pieces."""

    text: str = ""
    reason: str | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)

    def add(self, piece: Piece) -> None:
        self.text += piece.text
        self.reason = piece.reason or self.reason
        self.logprobs += piece.logprobs

    @property
    def cumulative_logprob(self) -> float:
        return sum(entry.logprob for entry in self.logprobs)


def _best(replies: list[Reply], n: int) -> list[Reply]:
    """The ``n`` replies of one prompt to return: all of them, or of ``best_of`` more the
    ``n`` with the highest cumulative log-probability, best first (vLLM's rule)."""
    if len(replies) == n:
        return replies
    return sorted(replies, key=lambda reply: reply.cumulative_logprob, reverse=True)[:n]


def sse_event(payload: dict) -> str:
    """One server-sent event carrying ``payload`` as JSON: ``data: {...}`` and a blank line."""
    return f"data: {json.dumps(payload)}\n\n"


def usage(prompt_tokens: int, completions: list[list[int]]) -> dict:
    """OpenAI's usage block: the prompt counted once (its blocks are shared by the ``n``
    samples), every sample's generated tokens (a stop token included)."""
    completion = sum(len(tokens) for tokens in completions)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion}


def _completion_choice(tokenizer, index: int, text: str, reason: str | None,
                       logprobs: list[TokenLogprob] | None) -> dict:
    """A completions choice (whole or streamed alike); its logprobs in the legacy format
    (parallel lists)."""
    if logprobs is not None:
        logprobs = {
            "tokens": [_token_text(tokenizer, e.token) for e in logprobs],
            "token_logprobs": [e.logprob for e in logprobs],
            "top_logprobs": [{_token_text(tokenizer, t): lp for t, lp in e.top}
                             for e in logprobs]}
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": reason}


def _chat_choice(tokenizer, field: str, index: int, text: str, reason: str | None,
                 logprobs: list[TokenLogprob] | None) -> dict:
    """A chat choice: a whole ``message`` (which names its role), or a streamed ``delta``
    (the role came in the stream's first chunk)."""
    body = {"role": "assistant", "content": text} if field == "message" else {"content": text}
    choice = {"index": index, field: body, "finish_reason": reason,
              "logprobs": None}
    if logprobs is not None:
        choice["logprobs"] = {"content": [
            {**_chat_token(tokenizer, e.token, e.logprob),
             "top_logprobs": [_chat_token(tokenizer, t, lp) for t, lp in e.top]}
            for e in logprobs]}
    return choice


def _token_text(tokenizer, token: int) -> str:
    return tokenizer.decode([token], skip_special_tokens=False)


def _chat_token(tokenizer, token: int, logprob: float) -> dict:
    text = _token_text(tokenizer, token)
    return {"token": text, "logprob": logprob, "bytes": list(text.encode())}
