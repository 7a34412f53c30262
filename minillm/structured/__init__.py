"""Structured output (chapter 16): constrain what a model may write to a regex, a JSON
schema, a list of choices or a grammar.

    from minillm import SamplingParams
    from minillm.structured import JsonSchema
    params = SamplingParams(max_tokens=64, structured=JsonSchema.of(MyPydanticModel))

:mod:`.spec` describes a constraint; :mod:`.regex_automaton`, :mod:`.token_mask` and
:mod:`.token_index` are the lesson (regex -> character automaton -> token masks, by
definition and fast); :mod:`.backend` puts the course's automaton and the production
library (xgrammar) behind one interface the engine uses (:mod:`minillm.engine.structured`).
"""

from .spec import Choice, Grammar, JsonObject, JsonSchema, Regex, StructuredOutput

__all__ = ["Choice", "Grammar", "JsonObject", "JsonSchema", "Regex", "StructuredOutput"]
