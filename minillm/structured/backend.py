"""Constraint backends: compile a request's :mod:`.spec` once, then give each sequence a
matcher that masks its logits and follows its tokens.

The engine talks to one small interface (vLLM V1's shape: one backend interface, several
libraries behind it):

* ``backend.compile(spec)`` turns a spec into a compiled grammar, or raises ``ValueError``
  saying what is wrong with it (an invalid JSON schema, a regex that does not parse);
* ``backend.matcher(compiled)`` starts a :class:`Matcher` at the beginning of an output.

Two backends implement it:

* :class:`XGrammarBackend`, the production one (xgrammar, chosen by measurement in
  ``benchmarks/structured_backends.py``): regexes, JSON schemas, any JSON object, choices
  and EBNF grammars, on bytes, with masks precomputed for most of the vocabulary so a step
  costs microseconds;
* :class:`AutomatonBackend`, the course's own (chapter 16): regexes and choices through a
  regex compiler (:func:`.regex_automaton.compile_regex`) and a token index
  (:func:`.token_index.token_index`), or the learner's (chapter 16's lab) in the real
  engine.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Protocol

import torch

from .regex_automaton import CharAutomaton, compile_regex, forced_text
from .spec import Choice, Grammar, JsonObject, JsonSchema, Regex, StructuredOutput
from .token_index import IndexFn, token_index
from .token_mask import special_token_ids, token_texts

MAX_ROLLBACK = 16  # tokens a matcher can take back: rejected speculative guesses, at most


class Matcher(Protocol):
    """Where one output stands in its grammar."""

    def mask_logits(self, logits: torch.Tensor) -> None:
        """Set the logits [vocab] of every token not allowed next to -inf, in place."""

    def accept(self, token: int) -> bool:
        """Move past ``token``; False (and no move) if the grammar does not allow it."""

    def rollback(self, num_tokens: int) -> None:
        """Take back the last ``num_tokens`` accepted tokens."""

    def forced_text(self) -> str:
        """Text every valid continuation starts with ("" if there is a choice)."""

    @property
    def is_terminated(self) -> bool:
        """The output is complete: a stop token was accepted."""


def describe(spec: StructuredOutput) -> str:
    """A short name of the kind of constraint, for error messages."""
    return {Regex: "regex", JsonSchema: "JSON schema", JsonObject: "JSON object",
            Choice: "choice", Grammar: "grammar"}[type(spec)]


def check_json_schema(schema: dict) -> None:
    """Raise ValueError if ``schema`` is not a valid JSON schema (the ``jsonschema``
    package's meta-schema check)."""
    import jsonschema  # loaded when a schema is first checked

    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as error:
        raise ValueError(f"invalid JSON schema: {error.message}") from None


def choice_grammar(options: tuple[str, ...]) -> str:
    """An EBNF grammar whose sentences are exactly ``options`` (JSON string literals are
    valid EBNF string literals, escapes included)."""
    return "root ::= " + " | ".join(json.dumps(option) for option in options)


class XGrammarBackend:
    """xgrammar's compiler and matchers over one tokenizer.

    ``tokenizer``: a Hugging Face tokenizer; ``vocab_size``: the model's (its logits'
    width, which may exceed the tokenizer's); ``stop_tokens``: the ids that end an output.
    JSON is compiled without free whitespace (``", "`` and ``": "`` separators): a
    grammar that allows any whitespace lets a small model write newlines forever.

    The vocabulary is given to xgrammar piece by piece, control tokens as empty pieces:
    ``TokenizerInfo.from_huggingface`` does not find SmolLM2's control tokens and would let
    ``<|im_start|>`` appear inside a JSON string. (Byte-level BPE, as SmolLM2's and
    Llama 3's: the pieces are bytes written as characters.)
    """

    def __init__(self, tokenizer, vocab_size: int, stop_tokens: list[int]):
        import xgrammar  # heavy: loaded when the first constraint is compiled

        self.xgr = xgrammar
        self.vocab_size = vocab_size
        pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        special = special_token_ids(tokenizer)  # empty pieces: xgrammar then never allows them
        vocab = ["" if i in special else piece for i, piece in enumerate(pieces)]
        info = xgrammar.TokenizerInfo(vocab, xgrammar.VocabType.BYTE_LEVEL,
                                      vocab_size=vocab_size, stop_token_ids=list(stop_tokens))
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=2)

    def compile(self, spec: StructuredOutput):
        try:
            return self._compile(spec)
        except RuntimeError as error:  # xgrammar's parse errors; keep their last line
            reason = str(error).strip().splitlines()[-1].split("] ")[-1]
            raise ValueError(f"the {describe(spec)} cannot be compiled: {reason}") from None

    def _compile(self, spec: StructuredOutput):
        match spec:
            case Regex(pattern):
                return self.compiler.compile_regex(pattern)
            case JsonSchema():
                check_json_schema(spec.as_dict)
                return self.compiler.compile_json_schema(spec.schema, any_whitespace=False)
            case JsonObject():
                return self.compiler.compile_json_schema('{"type": "object"}',
                                                         any_whitespace=False)
            case Choice(options):
                return self.compiler.compile_grammar(choice_grammar(options))
            case Grammar(ebnf):
                return self.compiler.compile_grammar(ebnf)
        raise ValueError(f"not a structured-output spec: {spec!r}")

    def matcher(self, compiled) -> XGrammarMatcher:
        return XGrammarMatcher(self.xgr, compiled, self.vocab_size)


class XGrammarMatcher:
    """An xgrammar ``GrammarMatcher`` with a one-row bitmask of its own."""

    def __init__(self, xgr, compiled, vocab_size: int):
        self.xgr = xgr
        self.inner = xgr.GrammarMatcher(compiled, max_rollback_tokens=MAX_ROLLBACK)
        self.bitmask = xgr.allocate_token_bitmask(1, vocab_size)

    def mask_logits(self, logits: torch.Tensor) -> None:
        self.inner.fill_next_token_bitmask(self.bitmask)
        self.xgr.apply_token_bitmask_inplace(logits[None], self.bitmask)

    def accept(self, token: int) -> bool:
        return self.inner.accept_token(token)

    def rollback(self, num_tokens: int) -> None:
        if num_tokens:
            self.inner.rollback(num_tokens)

    def forced_text(self) -> str:
        return self.inner.find_jump_forward_string()

    @property
    def is_terminated(self) -> bool:
        return self.inner.is_terminated()


class AutomatonBackend:
    """The course's backend: ``compile_fn`` (default :func:`.regex_automaton.compile_regex`)
    turns a regex (or a choice, as a regex) into a :class:`~.regex_automaton.CharAutomaton`,
    and ``index_fn`` (default :func:`.token_index.token_index`) indexes the vocabulary for
    it once; each state's mask is then asked for when first needed, and kept.

    ``index_fn(automaton, texts, stop_tokens)`` returns the function ``mask_of(state)`` ->
    bool [vocab] (the stop tokens allowed exactly when ``state`` accepts). Chapter 16's lab
    plugs the learner's compiler and index in here."""

    def __init__(self, tokenizer, vocab_size: int, stop_tokens: list[int],
                 compile_fn: Callable[[str], CharAutomaton] = compile_regex,
                 index_fn: IndexFn = token_index):
        self.texts = token_texts(tokenizer, vocab_size)
        self.stop_tokens = list(stop_tokens)
        self.compile_fn, self.index_fn = compile_fn, index_fn

    def compile(self, spec: StructuredOutput) -> CompiledAutomaton:
        match spec:
            case Regex(pattern):
                return CompiledAutomaton(self.compile_fn(pattern), self)
            case Choice(options):
                return CompiledAutomaton(self.compile_fn("|".join(map(re.escape, options))),
                                         self)
        raise ValueError(f"the course's automaton backend takes a regex or a choice, not a "
                         f"{describe(spec)}; use the engine's default backend (xgrammar)")

    def matcher(self, compiled: CompiledAutomaton) -> AutomatonMatcher:
        return AutomatonMatcher(compiled)


class CompiledAutomaton:
    """A regex's automaton, its token index, and its token masks, one per state, made when
    first needed."""

    def __init__(self, automaton: CharAutomaton, backend: AutomatonBackend):
        self.automaton, self.backend = automaton, backend
        self.mask_of = backend.index_fn(automaton, backend.texts, backend.stop_tokens)
        self.masks: dict[int, torch.Tensor] = {}

    def allowed(self, state: int) -> torch.Tensor:
        """bool [vocab]: the tokens allowed in ``state``, stop tokens when it accepts."""
        if state not in self.masks:
            self.masks[state] = self.mask_of(state)
        return self.masks[state]


class AutomatonMatcher:
    """The automaton state after each accepted token (a stack, so rollback is a pop)."""

    def __init__(self, compiled: CompiledAutomaton):
        self.compiled = compiled
        self.states = [compiled.automaton.initial]
        self.stopped = False

    def mask_logits(self, logits: torch.Tensor) -> None:
        logits.masked_fill_(~self.compiled.allowed(self.states[-1]), float("-inf"))

    def accept(self, token: int) -> bool:
        if self.stopped or not self.compiled.allowed(self.states[-1])[token]:
            return False
        if token in self.compiled.backend.stop_tokens:
            self.stopped = True
            self.states.append(self.states[-1])
            return True
        # a token without text (allowed only by a mask that lets everything through)
        # moves nothing; one the automaton cannot follow is refused, whatever the mask said
        state = self.compiled.automaton.walk(self.states[-1],
                                             self.compiled.backend.texts[token] or "")
        if state is None:
            return False
        self.states.append(state)
        return True

    def rollback(self, num_tokens: int) -> None:
        if num_tokens:
            del self.states[-num_tokens:]
            self.stopped = False

    def forced_text(self) -> str:
        return "" if self.stopped else forced_text(self.compiled.automaton, self.states[-1])

    @property
    def is_terminated(self) -> bool:
        return self.stopped
