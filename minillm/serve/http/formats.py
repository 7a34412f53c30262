"""Output constraints a request can ask for: OpenAI's ``response_format`` (text, any JSON
object, or JSON that follows a schema) and vLLM's ``guided_*`` fields, each mapped to the
engine's :mod:`~minillm.structured` constraint."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from ...structured.backend import check_json_schema
from ...structured.spec import Choice, Grammar, JsonObject, JsonSchema, Regex
from .parts import RequestPart, _refusal


def _checked_schema(schema: dict[str, Any], param: str) -> dict[str, Any]:
    """``schema`` if it is a valid JSON schema (the ``jsonschema`` package's check of it
    against its meta-schema), else a refusal naming ``param``."""
    try:
        check_json_schema(schema)
    except ValueError as error:
        raise _refusal(param, str(error)) from None
    return schema


class TextFormat(RequestPart):
    type: Literal["text"]

    def constraint(self) -> None:
        return None


class JsonObjectFormat(RequestPart):
    type: Literal["json_object"]

    def constraint(self) -> JsonObject:
        return JsonObject()


class JsonSchemaSpec(RequestPart):
    """OpenAI's ``json_schema``: the reply always follows ``schema`` (``strict`` or not)."""

    name: str
    description: str | None = None
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None

    @field_validator("schema_")
    @classmethod
    def _valid(cls, schema):
        return _checked_schema(schema, "response_format")


class JsonSchemaFormat(RequestPart):
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec

    def constraint(self) -> JsonSchema:
        return JsonSchema.of(self.json_schema.schema_)


ResponseFormat = Annotated[TextFormat | JsonObjectFormat | JsonSchemaFormat,
                           Field(discriminator="type")]

# vLLM's guided-decoding fields, and the constraint each one asks for
GUIDED = {"guided_regex": Regex, "guided_choice": Choice, "guided_json": JsonSchema.of,
          "guided_grammar": Grammar}
