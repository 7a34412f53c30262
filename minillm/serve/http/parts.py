"""What every part of a request shares: the server's limits, the refusal of unknown fields
and of OpenAI's that this server cannot honour (:data:`UNSUPPORTED`), and of text that is
not Unicode (a lone surrogate)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator
from pydantic_core import PydanticCustomError

from ...sampling import SEED_RANGE

# Limits a public server needs; each request past one gets a 400 that names it.
MAX_SAMPLES = 4  # n, and best_of
MAX_PROMPTS = 16  # prompts in one completions request (each is an engine request)
MAX_BODY_BYTES = 1 << 20  # a request body (a prompt of a million characters is no chat)
MAX_STOPS = 4  # stop strings (OpenAI's limit)
MAX_STOP_CHARS = 256  # characters of one stop string
SEED_BOUNDS = dict(ge=SEED_RANGE[0], le=SEED_RANGE[1])  # a 64-bit integer, as OpenAI's

_NO_TOOLS = "no tool calling; for a reply of a given shape, use response_format"
_NO_CACHE_CONTROL = "the engine's prefix cache is automatic and takes no key or retention"
# OpenAI's request fields this server cannot honour, and why: a request that asks for one
# gets a 400 saying so, not a reply that quietly ignored it.
UNSUPPORTED = {
    "suffix": "no fill-in-the-middle: the model only continues the prompt",
    "tools": _NO_TOOLS, "tool_choice": _NO_TOOLS, "parallel_tool_calls": _NO_TOOLS,
    "functions": _NO_TOOLS, "function_call": _NO_TOOLS,
    "audio": "text in, text out only", "modalities": "text in, text out only",
    "prediction": "no predicted outputs",
    "reasoning_effort": "the model does not reason before it answers",
    "verbosity": "no verbosity control; bound the reply with max_tokens",
    "web_search_options": "no web search",
    "service_tier": "there is one tier",
    "store": "completions are not stored", "metadata": "completions are not stored",
    "moderation": "no moderation",
    "prompt_cache_key": _NO_CACHE_CONTROL, "prompt_cache_retention": _NO_CACHE_CONTROL,
    "prompt_cache_options": _NO_CACHE_CONTROL,
    "include_obfuscation": "no stream obfuscation",  # in stream_options
}


def _refusal(param: str, message: str) -> PydanticCustomError:
    """A validation error about ``param``, its message shown as is: the error body names
    ``param`` even when a rule across several fields raised it."""
    return PydanticCustomError("refused", message, {"param": param})


_SCALARS = frozenset({int, float, bool, type(None)})  # JSON's values that hold no text


def _lone_surrogate(data: Any) -> tuple[str, str, int, bool] | None:
    """Where the first text of ``data`` (parsed JSON: its keys too) that is not Unicode is:
    (the dotted path of its field, the surrogate escaped, its position, whether it is a
    key). JSON's ``\\udcff`` escape parses to a lone surrogate, which no UTF-8 encoder,
    tokenizer or grammar compiler takes. The walk keeps its own stack (a deeply nested
    body must not overflow Python's), and each value's path as a link to its parent's,
    spelled out only for the one found."""
    stack: list[tuple[Any, tuple | None]] = [(data, None)]
    while stack:
        value, link = stack.pop()
        if isinstance(value, dict):
            for key in value:
                if (where := _surrogate_at(key)) is not None:
                    return _spelled(link), f"\\u{ord(key[where]):04x}", where, True
            children = value.items()
        elif isinstance(value, list):
            if _SCALARS.issuperset(map(type, value)):  # token ids: nothing to read, fast
                continue
            children = enumerate(value)
        else:
            if (where := _surrogate_at(value)) is not None:
                return _spelled(link), f"\\u{ord(value[where]):04x}", where, False
            continue
        stack += reversed([(item, (link, name)) for name, item in children
                           if type(item) not in _SCALARS])
    return None


def _spelled(link: tuple | None) -> str:
    """A path of parent links, dotted: ``messages.0.content``."""
    names = []
    while link is not None:
        link, name = link
        names.append(str(name))
    return ".".join(reversed(names))


def _surrogate_at(text: Any) -> int | None:
    """The position of the first surrogate in ``text`` if it is a string (in one parsed
    from JSON every surrogate is a lone one: a valid pair parses to one character)."""
    if not isinstance(text, str) or text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        return error.start
    return None


class RequestPart(BaseModel):
    """A request, or a part of one. An unknown field is refused (a 400 that names it),
    never ignored; so is one of OpenAI's that this server cannot honour (:data:`UNSUPPORTED`,
    with the reason), unless its value asks for nothing (null or false, as some clients
    send: ``"tools": null``, ``"store": false``). So is text that is not Unicode."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _drop_unsupported_asking_nothing(cls, data):
        if not isinstance(data, dict):
            return data
        return {name: value for name, value in data.items()
                if name not in UNSUPPORTED or value not in (None, False)}

    @model_validator(mode="before")
    @classmethod
    def _unicode_text(cls, data):
        """Refused, not decoded with replacement characters (as vLLM does): a replaced
        character would change the prompt, a stop string or a constraint into one the
        client did not send, and the reply would quietly answer another request. A lone
        surrogate is a client's bug (a text cut between the two halves of a UTF-16 pair),
        and a 400 tells the client so. Checked on the whole body before any field is validated (the
        outermost part runs first), so no field, tokenizer or error message sees one."""
        if (found := _lone_surrogate(data)) is None:
            return data
        path, escaped, where, key = found
        raise _refusal(path, f"{'a key of this object' if key else 'the text'} is not valid "
                       f"Unicode: it holds a lone surrogate ({escaped} at character "
                       f"{where}), half of a UTF-16 pair; send whole characters (both "
                       "halves of a pair, or the character itself)")


class StreamOptions(RequestPart):
    include_usage: bool = False
