"""The request bodies: completions (:class:`CompletionRequest`) and chat completions
(:class:`ChatRequest`), and the fields they share (:class:`GenerationRequest`): OpenAI's
names, defaults and ranges, vLLM's extras, and the rules across fields, each refused
with a message that names the field."""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from ...sampling import MAX_LOGIT_BIAS, MAX_LOGPROBS, MAX_PENALTY, SamplingParams
from ...structured.spec import StructuredOutput
from .formats import GUIDED, ResponseFormat, _checked_schema
from .parts import (
    MAX_PROMPTS,
    MAX_SAMPLES,
    MAX_STOP_CHARS,
    MAX_STOPS,
    SEED_BOUNDS,
    RequestPart,
    StreamOptions,
    _refusal,
)


class GenerationRequest(RequestPart):
    """The fields shared by completions and chat completions: OpenAI's (names, defaults,
    ranges), and vLLM's extras (``top_k``, ``min_p``, ``repetition_penalty``, ``guided_*``,
    ``include_stop_str_in_output``).
    ``user`` is accepted and unused: it only identifies the caller (to OpenAI, for abuse
    monitoring)."""

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = Field(default=None, **SEED_BOUNDS)
    stop: str | list[str] | None = None
    n: int = Field(default=1, ge=1, le=MAX_SAMPLES)
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = Field(default=0.0, ge=-MAX_PENALTY, le=MAX_PENALTY)
    frequency_penalty: float = Field(default=0.0, ge=-MAX_PENALTY, le=MAX_PENALTY)
    logit_bias: dict[str, float] | None = None  # JSON's string keys; validated to int ones
    response_format: ResponseFormat | None = None
    user: str | None = None
    top_k: int = Field(default=0, ge=-1)  # 0, or vLLM's -1: off
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0)
    guided_regex: str | None = None
    guided_choice: list[str] | None = Field(default=None, min_length=1)
    guided_json: dict[str, Any] | str | None = None
    guided_grammar: str | None = Field(default=None, min_length=1)
    include_stop_str_in_output: bool = False  # the reply ends after its stop string, keeping it

    @model_validator(mode="after")
    def _stream_options_need_stream(self):
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")
        return self

    @model_validator(mode="after")
    def _one_constraint(self):
        asked = list(self.constraints())
        if len(asked) > 1:
            raise _refusal(asked[1], "give at most one output constraint; got "
                           + " and ".join(asked))
        return self

    @field_validator("stop")
    @classmethod
    def _stops_within_limits(cls, stop):
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        if len(stops) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop strings, got {len(stops)}")
        if any(not 0 < len(s) <= MAX_STOP_CHARS for s in stops):
            raise ValueError(f"each stop string must have 1 to {MAX_STOP_CHARS} characters")
        return stop

    @field_validator("logit_bias")
    @classmethod
    def _token_ids_and_biases(cls, logit_bias):
        """JSON's keys are strings: each must be a token id, and map to a bias in OpenAI's
        range. (Whether the id is in the vocabulary, the server checks: it knows the model.)"""
        checked = {}
        for key, bias in (logit_bias or {}).items():
            try:
                checked[int(key)] = bias
            except ValueError:
                raise _refusal("logit_bias", f"the key {key!r} is not a token id; give token "
                               "ids (as strings), e.g. {\"1234\": -100}") from None
            if not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
                raise _refusal("logit_bias", f"the bias of token {key} is {bias}; biases go "
                               f"from -{MAX_LOGIT_BIAS} to {MAX_LOGIT_BIAS}")
        return checked or None

    @field_validator("top_k")
    @classmethod
    def _minus_one_is_off(cls, top_k):
        return max(top_k, 0)

    @field_validator("guided_regex")
    @classmethod
    def _compiles(cls, pattern):
        if pattern is None:
            return None
        try:
            re.compile(pattern)
        except re.error as error:
            raise _refusal("guided_regex", f"not a valid regular expression: {error}") from None
        return pattern

    @field_validator("guided_json")
    @classmethod
    def _a_json_schema(cls, schema):
        if schema is None:
            return None
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as error:
                raise _refusal("guided_json", f"a JSON schema, but not JSON: {error}") from None
        if not isinstance(schema, dict):
            raise _refusal("guided_json", "a JSON schema is a JSON object")
        return _checked_schema(schema, "guided_json")

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def constraints(self) -> dict[str, StructuredOutput]:
        """The output constraints asked for, by the field that asks (one at most, once
        validated)."""
        asked = {}
        if self.response_format is not None and self.response_format.constraint():
            asked["response_format"] = self.response_format.constraint()
        for name, constraint in GUIDED.items():
            if getattr(self, name) is not None:
                asked[name] = constraint(getattr(self, name))
        return asked

    @property
    def samples(self) -> int:
        """Samples generated per prompt."""
        return self.n

    def token_limit(self) -> int | None:
        return self.max_tokens

    def requested_logprobs(self) -> int | None:
        """Alternatives per token the client wants back (None: no log-probabilities)."""
        raise NotImplementedError

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        """The engine's parameters for each prompt of this request. Ranking ``best_of``
        samples needs their log-probabilities, so they are recorded even when unwanted."""
        logprobs = self.requested_logprobs()
        if logprobs is None and self.samples > self.n:
            logprobs = 0
        return SamplingParams(
            temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
            min_p=self.min_p, repetition_penalty=self.repetition_penalty,
            presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
            logit_bias=self.logit_bias or {}, seed=self.seed, n=self.samples,
            logprobs=logprobs, max_tokens=max_tokens, stop=tuple(self.stops()),
            include_stop_str_in_output=self.include_stop_str_in_output,
            structured=next(iter(self.constraints().values()), None))


Prompts = Annotated[list[str], Field(min_length=1, max_length=MAX_PROMPTS)]
TokenPrompts = Annotated[list[list[int]], Field(min_length=1, max_length=MAX_PROMPTS)]


class CompletionRequest(GenerationRequest):
    """A completion of one prompt or several (OpenAI's four shapes: a string, a list of
    strings, a list of token ids, a list of lists of token ids); ``echo`` puts the prompt
    before each choice's text, and ``best_of`` samples return the ``n`` most likely."""

    prompt: str | Prompts | Annotated[list[int], Field(min_length=1)] | TokenPrompts
    max_tokens: int | None = Field(default=16, ge=1)  # OpenAI's default for completions
    logprobs: int | None = Field(default=None, ge=0, le=5)
    echo: bool = False
    best_of: int | None = Field(default=None, ge=1, le=MAX_SAMPLES)

    @field_validator("prompt", mode="wrap")
    @classmethod
    def _one_of_four_shapes(cls, prompt, validate):
        """One message for a prompt of no known shape (not one per shape tried)."""
        try:
            return validate(prompt)
        except ValidationError:
            raise _refusal("prompt", "give a string, a list of strings, a list of token ids "
                           f"or a list of lists of token ids (1 to {MAX_PROMPTS} prompts)"
                           ) from None

    @model_validator(mode="after")
    def _best_of_and_echo_fit(self):
        if self.best_of is not None and self.best_of < self.n:
            raise _refusal("best_of", f"must be at least n ({self.n}), got {self.best_of}: "
                           "it is how many samples are generated, of which the n most likely "
                           "are returned")
        if self.samples > self.n and self.stream:
            raise _refusal("best_of", "more than n cannot stream (the best samples are "
                           "known only at the end); set stream to false, or best_of to n")
        if self.echo and self.logprobs is not None:
            raise _refusal("echo", "not supported with logprobs by this server (it would "
                           "need the prompt tokens' log-probabilities, which the engine does "
                           "not compute); ask for one or the other")
        return self

    @property
    def samples(self) -> int:
        return self.best_of or self.n

    def prompts(self) -> list[str | list[int]]:
        """Each prompt, as text or as token ids."""
        one = isinstance(self.prompt, str) or isinstance(self.prompt[0], int)
        return [self.prompt] if one else list(self.prompt)

    def requested_logprobs(self) -> int | None:
        return self.logprobs


class Message(RequestPart):
    role: Literal["system", "user", "assistant"]
    content: str


class ChatRequest(GenerationRequest):
    """A chat completion. ``max_completion_tokens`` is the newer name of ``max_tokens``;
    ``safety_identifier``, like ``user``, is accepted and unused (it only identifies the
    caller)."""

    messages: list[Message] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    safety_identifier: str | None = None

    @model_validator(mode="after")
    def _top_logprobs_need_logprobs(self):
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs to be true")
        return self

    @model_validator(mode="after")
    def _one_token_limit(self):
        if None not in (self.max_tokens, self.max_completion_tokens) and \
                self.max_tokens != self.max_completion_tokens:
            raise _refusal("max_completion_tokens", "give max_completion_tokens (the newer "
                           "name) or max_tokens, not two different limits")
        return self

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def requested_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None
