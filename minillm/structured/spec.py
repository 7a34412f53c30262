"""What a request may ask its output to be: a regex, a JSON schema, any JSON object, one of
a list of strings, or a grammar.

These are plain descriptions, hashable so that :class:`~minillm.sampling.SamplingParams`
stays frozen and the engine compiles each distinct one once (:mod:`.backend`). A JSON
schema is kept as its JSON text for the same reason (in its own key order: an object's
properties are written in the order the schema lists them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Regex:
    r"""The whole output matches ``pattern``: Python's ``re.fullmatch(pattern, output,
    re.ASCII)`` (``\d`` is ``[0-9]``, ``\w`` ``[A-Za-z0-9_]``, as in xgrammar)."""

    pattern: str


@dataclass(frozen=True)
class JsonSchema:
    """The output is one JSON value valid under ``schema`` (JSON text; build one with
    :meth:`of` from a dict or a Pydantic model class)."""

    schema: str

    @classmethod
    def of(cls, schema: dict[str, Any] | str | type) -> JsonSchema:
        """From a dict, JSON text, or a Pydantic model class (its ``model_json_schema()``)."""
        if isinstance(schema, type) and hasattr(schema, "model_json_schema"):
            schema = schema.model_json_schema()
        if isinstance(schema, str):
            schema = json.loads(schema)
        if not isinstance(schema, dict):
            raise ValueError(f"a JSON schema is a JSON object, got {type(schema).__name__}")
        return cls(json.dumps(schema))  # key order kept: properties are written in it

    @property
    def as_dict(self) -> dict[str, Any]:
        return json.loads(self.schema)


@dataclass(frozen=True)
class JsonObject:
    """The output is any JSON object (OpenAI's ``response_format={"type": "json_object"}``)."""


@dataclass(frozen=True)
class Choice:
    """The output is exactly one of ``options``."""

    options: tuple[str, ...]

    def __post_init__(self):
        if not self.options:
            raise ValueError("a choice needs at least one option")
        object.__setattr__(self, "options", tuple(self.options))


@dataclass(frozen=True)
class Grammar:
    """The output is a sentence of a context-free grammar in EBNF (xgrammar's dialect, the
    GBNF of llama.cpp: rules ``name ::= ...``, the start rule named ``root``)."""

    ebnf: str


StructuredOutput = Regex | JsonSchema | JsonObject | Choice | Grammar
