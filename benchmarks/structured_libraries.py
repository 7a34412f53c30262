"""The structured-output libraries that benchmarks/structured_backends.py compares, behind
one interface, and the cases it measures them on.

Each of :class:`XGrammar`, :class:`LLGuidance` and :class:`OutlinesCore` makes the public
calls an engine makes: ``prepare`` (one-time tokenizer preparation), ``compile`` (a
case's grammar), ``matcher`` (a fresh one per request), ``fill`` (the next-token bitmask),
``accept`` and ``rollback``. ``FEATURES`` names the API behind each feature.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import llguidance
import llguidance.hf
import llguidance.torch
import numpy as np
import outlines_core
import outlines_core.kernels.torch
import torch
import xgrammar as xgr

VOCAB = 49152
NUM_SPECIAL = 17  # SmolLM2's ids 0..16 are special (<|endoftext|>, <|im_start|>, ...)
LIBRARIES = ("xgrammar", "llguidance", "outlines-core")

FLAT = {"type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                       "city": {"enum": ["Paris", "Rome"]}},
        "required": ["name", "age", "city"], "additionalProperties": False}
AUTHOR = {"type": "object",
          "properties": {"name": {"type": "string"}, "year": {"type": "integer"}},
          "required": ["name", "year"], "additionalProperties": False}
NESTED = {"type": "object",
          "properties": {"title": {"type": "string"},
                         "authors": {"type": "array", "items": AUTHOR},
                         "tags": {"type": "array", "items": {"type": "string"},
                                  "maxItems": 3}},
          "required": ["title", "authors", "tags"], "additionalProperties": False}
CHOICES = ("positive", "negative", "neutral", "mixed")


@dataclass
class Case:
    key: str
    name: str
    kind: str  # "schema", "regex" or "object" (any JSON object)
    spec: object
    text: str  # a valid output, compact
    compact: bool = False  # the aligned-whitespace variant of a JSON case


CASES = [
    Case("a", "flat object", "schema", FLAT, '{"name":"Ann","age":30,"city":"Paris"}'),
    Case("b", "nested object", "schema", NESTED,
         '{"title":"Attention Is All You Need","authors":[{"name":"Vaswani","year":2017},'
         '{"name":"Shazeer","year":2017}],"tags":["nlp","transformers"]}'),
    Case("c", "ISO date regex", "regex", r"\d{4}-\d{2}-\d{2}", "2024-05-17"),
    Case("d", "choice of 4", "regex", "(" + "|".join(CHOICES) + ")", "neutral"),
    Case("e", "any JSON object", "object", None,
         '{"model":"smollm2","layers":30,"tied":true,"scores":[0.5,-1,null],'
         '"meta":{"note":"a \\"quoted\\" word"}}'),
]


def gpt2_byte_decoder() -> dict[str, int]:
    """The inverse of GPT-2's bytes_to_unicode: the printable character each byte is
    written as in a byte-level BPE vocabulary (``Ġ`` for a space) -> the byte."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: chr(b) for b in kept}
    shifted = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + shifted)
            shifted += 1
    return {c: b for b, c in chars.items()}


def outlines_vocabulary(hf, eos: int) -> outlines_core.Vocabulary:
    """What ``outlines_core.Vocabulary.from_pretrained`` builds, offline: the BPE model's
    tokens (``get_vocab(with_added_tokens=False)``) as raw bytes (313 of SmolLM2's are not
    valid UTF-8 alone, so bytes keys, not strings), eos left out. Like from_pretrained it
    keeps SmolLM2's special tokens, which are also in the model's vocabulary, as their
    literal text (checked: equal to from_pretrained's vocabulary for this tokenizer)."""
    decoder = gpt2_byte_decoder()
    tokens: dict[bytes, list[int]] = {}
    for token, token_id in hf.backend_tokenizer.get_vocab(with_added_tokens=False).items():
        if token_id != eos:
            tokens.setdefault(bytes(decoder[c] for c in token), []).append(token_id)
    return outlines_core.Vocabulary(eos, tokens)


def allowed(bitmask_row: torch.Tensor) -> np.ndarray:
    """A [VOCAB] bool array from one row of an int32 bitmask (bit i of word j: id 32j+i)."""
    return np.unpackbits(bitmask_row.numpy().view(np.uint8), bitorder="little")[:VOCAB] \
        .astype(bool)


def timed(fn, *args, **kwargs):
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    return time.perf_counter() - start, result


class XGrammar:
    name = "xgrammar"
    prepare_call = "xgr.TokenizerInfo.from_huggingface"

    def prepare(self, hf, stop, threads):
        self.info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=VOCAB,
                                                       stop_token_ids=stop)
        self.threads = threads
        self.cached = xgr.GrammarCompiler(self.info, max_threads=threads)

    def compile(self, case, cache=False):
        compiler = self.cached if cache else xgr.GrammarCompiler(
            self.info, max_threads=self.threads, cache_enabled=False)
        if case.kind == "regex":
            return compiler.compile_regex(case.spec)
        if case.kind == "object":
            return compiler.compile_builtin_json_grammar()
        if case.compact:
            return compiler.compile_json_schema(json.dumps(case.spec), any_whitespace=False,
                                                separators=(",", ":"))
        return compiler.compile_json_schema(json.dumps(case.spec))

    def matcher(self, compiled):
        return xgr.GrammarMatcher(compiled)

    def fill(self, matcher, bitmask):
        matcher.fill_next_token_bitmask(bitmask, 0)

    def accept(self, matcher, token):
        return matcher.accept_token(token)

    def rollback(self, matcher, n):
        matcher.rollback(n)


class LLGuidance:
    name = "llguidance"
    prepare_call = "llguidance.hf.from_tokenizer"

    def prepare(self, hf, stop, threads):
        self.tokenizer = llguidance.hf.from_tokenizer(hf, n_vocab=VOCAB, eos_token=stop)

    def grammar(self, case):
        if case.kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(case.spec)
        schema = {"type": "object"} if case.kind == "object" else case.spec
        overrides = {"whitespace_flexible": False} if case.compact else None
        return llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=overrides)

    def compile(self, case, cache=False):
        """The grammar text, checked by building a matcher from it (that is the compile:
        llguidance has no compiled-grammar object to share, each request builds one)."""
        grammar = self.grammar(case)
        if (matcher := llguidance.LLMatcher(self.tokenizer, grammar)).is_error():
            raise ValueError(matcher.get_error())
        return grammar

    def matcher(self, compiled):
        return llguidance.LLMatcher(self.tokenizer, compiled)

    def fill(self, matcher, bitmask):
        llguidance.torch.fill_next_token_bitmask(matcher, bitmask, 0)

    def accept(self, matcher, token):
        return matcher.consume_token(token)

    def rollback(self, matcher, n):
        matcher.rollback(n)


class OutlinesCore:
    name = "outlines-core"
    prepare_call = "outlines_core.Vocabulary(eos, {token bytes: [ids]})"

    def prepare(self, hf, stop, threads):
        self.vocabulary = outlines_vocabulary(hf, hf.eos_token_id)

    def regex(self, case):
        if case.kind == "regex":
            return case.spec
        schema = {"type": "object"} if case.kind == "object" else case.spec
        whitespace = "" if case.compact else None
        return outlines_core.json_schema.build_regex_from_schema(json.dumps(schema),
                                                                 whitespace_pattern=whitespace)

    def compile(self, case, cache=False):
        return outlines_core.Index(self.regex(case), self.vocabulary)

    def matcher(self, compiled):
        return outlines_core.Guide(compiled)

    def fill(self, matcher, bitmask):
        outlines_core.kernels.torch.fill_next_token_bitmask(matcher, bitmask)

    def accept(self, matcher, token):
        try:
            matcher.advance(token, return_tokens=False)
            return True
        except ValueError:
            return False

    def rollback(self, matcher, n):
        matcher.rollback_state(n)


FEATURES = {  # feature -> library -> the API that provides it (None: no such API)
    "regex": {"xgrammar": (xgr.GrammarCompiler, "compile_regex"),
              "llguidance": (llguidance.LLMatcher, "grammar_from_regex"),
              "outlines-core": (outlines_core, "Index")},
    "JSON schema": {"xgrammar": (xgr.GrammarCompiler, "compile_json_schema"),
                    "llguidance": (llguidance.LLMatcher, "grammar_from_json_schema"),
                    "outlines-core": (outlines_core.json_schema, "build_regex_from_schema")},
    "EBNF grammar": {"xgrammar": (xgr.GrammarCompiler, "compile_grammar"),
                     "llguidance": (llguidance.LLMatcher, "grammar_from_lark"),
                     "outlines-core": None},
    "jump-forward": {"xgrammar": (xgr.GrammarMatcher, "find_jump_forward_string"),
                     "llguidance": (llguidance.LLMatcher, "compute_ff_bytes"),
                     "outlines-core": None},
    "rollback": {"xgrammar": (xgr.GrammarMatcher, "rollback"),
                 "llguidance": (llguidance.LLMatcher, "rollback"),
                 "outlines-core": (outlines_core.Guide, "rollback_state")},
}


def features(walks) -> dict[str, dict[str, bool]]:
    table = {}
    for feature, apis in FEATURES.items():
        table[feature] = {lib: api is not None and hasattr(*api) for lib, api in apis.items()}
    for lib in LIBRARIES:  # rollback must also have given back the earlier masks
        checked = [w.rollback_ok for (name, _), w in walks.items() if name == lib and
                   not w.error and w.rejected is None]
        table["rollback"][lib] = table["rollback"][lib] and all(checked)
    return table

