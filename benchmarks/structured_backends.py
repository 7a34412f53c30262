"""Structured-output libraries on SmolLM2's tokenizer: xgrammar, llguidance, outlines-core.

    python benchmarks/structured_backends.py                    # the tables, ~1-2 minutes
    python benchmarks/structured_backends.py --json out.json    # + the numbers as JSON
    python benchmarks/structured_backends.py --busy-ok          # on a busy machine too

Which library should the engine use to constrain decoding? Each one is measured on the
same 49,152-token byte-level vocabulary, with the library's public calls an engine makes:

1. one-time tokenizer preparation (outlines-core's vocabulary is built offline the way
   ``Vocabulary.from_pretrained`` builds it: every token of the BPE model's vocabulary
   mapped back to its raw bytes through the GPT-2 byte decoder, eos left out);
2. compile time for five cases: (a) a flat object, (b) a nested object with arrays,
   (c) a regex for an ISO date, (d) a choice among four strings as a regex alternation,
   (e) any JSON object. First compile in the process (cold), the median of a few fresh
   ones (skipped when the cold one took over a second), and xgrammar's compile cache;
3. the time to fill the next-token bitmask at every step of a walk along a valid output
   (the output's ordinary tokenization, compact JSON which every library's whitespace
   rules accept), median and max over ``--walks`` walks with a fresh matcher each; and
   the time to apply a bitmask to float32 logits of [1, 49152] and [16, 49152];
4. agreement: at each step of the first walk, the allowed token ids of the three
   libraries (ids of the 17 special tokens left out, except eos 2 which stands for
   "may stop here"), compared exactly; JSON cases also in a compact-whitespace variant
   (``--no-aligned`` skips it) where differences can only come from the JSON rules;
   plus the steps at which a library lets a special token through as text;
5. features read from each library's API (rollback is also exercised: after each walk
   the matcher steps back and must give the same mask as before).

The recommendation is computed: the fastest median mask time among the libraries that
have regex, JSON schema, grammar and rollback support. Timings are only honest on a
quiet machine (:func:`minillm.machine.quiet_problem`); ``--busy-ok`` marks them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass, field
from functools import partial

import llguidance
import llguidance.hf
import llguidance.torch
import numpy as np
import outlines_core
import outlines_core.kernels.torch
import torch
import xgrammar as xgr

from minillm import Tokenizer
from minillm.machine import describe, quiet_problem

VOCAB = 49152
NUM_SPECIAL = 17  # SmolLM2's ids 0..16 are special (<|endoftext|>, <|im_start|>, ...)
LIBRARIES = ("xgrammar", "llguidance", "outlines-core")
SHORT = {"xgrammar": "xgr", "llguidance": "llg", "outlines-core": "oc"}
PAIRS = [("xgrammar", "llguidance"), ("xgrammar", "outlines-core"),
         ("llguidance", "outlines-core")]

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


@dataclass
class Walk:
    """One library on one case: compile times, mask times, the masks of the first walk."""

    cold: float = float("nan")
    fresh: float | None = None
    cached: float | None = None
    mask_us: list[float] = field(default_factory=list)
    masks: list[np.ndarray] = field(default_factory=list)
    rejected: int | None = None  # the step whose token the library refused, if any
    stops_at_end: bool = False
    rollback_ok: bool = True
    error: str | None = None


def walk(lib, case, tokens, walks, compiles) -> Walk:
    out = Walk()
    try:
        out.cold, compiled = timed(lib.compile, case)
    except Exception as error:  # noqa: BLE001 - a library that cannot express the case
        out.error = f"{type(error).__name__}: {error}"[:200]
        return out
    if out.cold < 1.0 and compiles > 1:
        out.fresh = statistics.median(timed(lib.compile, case)[0] for _ in range(compiles))
    if isinstance(lib, XGrammar):
        lib.compile(case, cache=True)
        out.cached = timed(lib.compile, case, cache=True)[0]
    bitmask = torch.zeros((1, (VOCAB + 31) // 32), dtype=torch.int32)
    for attempt in range(walks):
        matcher = lib.matcher(compiled)
        for step in range(len(tokens) + 1):
            start = time.perf_counter_ns()
            lib.fill(matcher, bitmask)
            out.mask_us.append((time.perf_counter_ns() - start) / 1000)
            if attempt == 0:
                out.masks.append(allowed(bitmask[0]))
            if step == len(tokens):
                out.stops_at_end = bool(out.masks[-1][2])
                break
            if not lib.accept(matcher, tokens[step]):
                out.rejected = step
                return out
        if attempt == 0:  # rollback: step back and compare with the mask seen there
            back = min(4, len(tokens))
            lib.rollback(matcher, back)
            lib.fill(matcher, bitmask)
            out.rollback_ok = bool(np.array_equal(allowed(bitmask[0]),
                                                  out.masks[len(tokens) - back]))
    return out


def comparable(mask: np.ndarray) -> np.ndarray:
    """Ordinary tokens, plus eos (id 2) for "may stop here"; other special ids cleared."""
    mask = mask.copy()
    mask[:NUM_SPECIAL] = False
    mask[2] = False
    return mask


def stop_allowed(mask: np.ndarray) -> bool:
    return bool(mask[2])


def special_leaks(masks: list[np.ndarray], stop: list[int]) -> tuple[int, set[int]]:
    """Steps at which a special token is allowed as text, and which ids: a special id
    that is not a stop id at any step, or a stop id before the output is complete (every
    step but the last; none of the cases' valid outputs is complete earlier)."""
    steps, ids = 0, set()
    for step, mask in enumerate(masks):
        early = step < len(masks) - 1
        leaked = {i for i in np.nonzero(mask[:NUM_SPECIAL])[0].tolist()
                  if early or i not in stop}
        steps += bool(leaked)
        ids |= leaked
    return steps, ids


def id_ranges(ids) -> str:
    """``{0, 1, 3, 4, 5}`` -> ``"0-1, 3-5"``."""
    ids, parts = sorted(ids), []
    for i in ids:
        if parts and parts[-1][1] == i - 1:
            parts[-1][1] = i
        else:
            parts.append([i, i])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in parts) or "none"


def describe_tokens(ids, hf, limit=3) -> str:
    decoder = gpt2_byte_decoder()
    shown = []
    for token_id in ids[:limit]:
        if token_id == -1:
            shown.append("<stop>")
            continue
        raw = bytes(decoder[c] for c in hf.convert_ids_to_tokens(int(token_id)))
        try:
            shown.append(repr(raw.decode()))
        except UnicodeDecodeError:
            shown.append(repr(raw))
    return ", ".join(shown) + (", ..." if len(ids) > limit else "")


def agreement(case, walks: dict[str, Walk], hf) -> tuple[dict, list[str]]:
    """Per pair of libraries: steps with equal sets and the largest symmetric difference;
    and in words, per pair and direction, the distinct token ids one allows and the other
    refuses over the whole walk (in order of first appearance)."""
    if any(w.error or w.rejected is not None for w in walks.values()):
        return {}, []
    steps = min(len(w.masks) for w in walks.values())
    sets = {lib: [np.append(comparable(m), stop_allowed(m)) for m in w.masks[:steps]]
            for lib, w in walks.items()}
    row, notes = {"steps": steps}, []
    row["all"] = sum(all(np.array_equal(sets[LIBRARIES[0]][s], sets[lib][s])
                         for lib in LIBRARIES[1:]) for s in range(steps))
    biggest = 0
    for a, b in PAIRS:
        same = 0
        only = {(a, b): {}, (b, a): {}}  # token id -> first step, dicts keep the order
        at = {(a, b): [], (b, a): []}  # the steps with a difference in that direction
        for s in range(steps):
            diff = 0
            for x, y in only:
                ids = np.nonzero(sets[x][s] & ~sets[y][s])[0]
                diff += len(ids)
                at[x, y] += [s] if len(ids) else []
                for token_id in ids.tolist():
                    only[x, y].setdefault(-1 if token_id == VOCAB else token_id, s)
            same += diff == 0
            biggest = max(biggest, diff)
        row[f"{SHORT[a]}={SHORT[b]}"] = same
        for (x, y), first in only.items():
            if first:
                notes.append(f"({case.key}) {SHORT[x]} not {SHORT[y]}: {len(first)} ids at "
                             f"{len(at[x, y])} steps from {at[x, y][0]}: "
                             f"{describe_tokens(list(first), hf)}")
    row["max_diff"] = biggest
    return row, notes


def apply_times(repeats: int) -> dict:
    """Microseconds to apply a random bitmask to float32 logits, median of ``repeats``;
    llguidance's kernel is torch.compile'd, its first call (the compile) is reported."""
    result = {}
    for batch in (1, 16):
        logits = torch.randn(batch, VOCAB)
        bitmask = torch.randint(-2**31, 2**31 - 1, (batch, (VOCAB + 31) // 32),
                                dtype=torch.int32)
        calls = {"xgrammar": partial(xgr.apply_token_bitmask_inplace, logits, bitmask),
                 "llguidance": partial(llguidance.torch.apply_token_bitmask_inplace,
                                       logits, bitmask)}
        for lib, call in calls.items():
            try:
                first, _ = timed(call)
                times = [timed(call)[0] * 1e6 for _ in range(repeats)]
                result[f"{lib} [{batch}]"] = {"first_s": first,
                                              "median_us": statistics.median(times)}
            except Exception as error:  # noqa: BLE001 - e.g. no C compiler for inductor
                result[f"{lib} [{batch}]"] = {"error": str(error)[:200]}
    return result


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


def ms(seconds) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--walks", type=int, default=3, help="walks per case and library")
    parser.add_argument("--compiles", type=int, default=3,
                        help="fresh compiles for the median (when one takes under 1 s)")
    parser.add_argument("--apply-repeats", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-aligned", action="store_true",
                        help="skip the compact-whitespace agreement rows of the JSON cases")
    parser.add_argument("--json", metavar="PATH", help="also write the numbers here")
    parser.add_argument("--busy-ok", action="store_true",
                        help="run on a busy machine too (the times are then not recorded)")
    args = parser.parse_args(argv)
    problem = quiet_problem()
    if problem is not None and not args.busy_ok:
        raise SystemExit(f"not measuring: {problem} (or pass --busy-ok)")
    torch.set_num_threads(args.threads)

    tokenizer = Tokenizer("smollm2")
    hf, stop = tokenizer.hf, tokenizer.stop_tokens
    libs = [XGrammar(), LLGuidance(), OutlinesCore()]
    prepare = {lib.name: timed(lib.prepare, hf, stop, args.threads)[0] for lib in libs}

    cases = list(CASES)
    if not args.no_aligned:
        cases += [Case(c.key + "'", c.name + ", compact", c.kind, c.spec, c.text, True)
                  for c in CASES if c.kind == "schema"]
    walks: dict[tuple[str, str], Walk] = {}
    for case in cases:
        tokens = hf.encode(case.text, add_special_tokens=False)
        walk_count = 1 if case.compact else args.walks
        for lib in libs:
            walks[lib.name, case.key] = walk(lib, case, tokens, walk_count, args.compiles)
    apply = apply_times(args.apply_repeats)
    feature_table = features(walks)

    record = "busy machine: NOT for the record" if problem else "quiet machine"
    print(f"{describe()}, {record}")
    print(f"SmolLM2-135M-Instruct tokenizer, {VOCAB:,} tokens, stop ids {stop}; "
          f"{args.threads} threads")
    print("\nOne-time tokenizer preparation")
    print("| library | ms | call |\n|---|---:|---|")
    for lib in libs:
        print(f"| {lib.name} | {prepare[lib.name] * 1000:.0f} | {lib.prepare_call} |")

    main_cases = [c for c in cases if not c.compact]
    print("\nCompile (ms): cold = first in the process; fresh = median of "
          f"{args.compiles} more; xgr cache hit")
    print("| case | xgr cold | fresh | cached | llg cold | fresh | oc cold | fresh |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for case in main_cases:
        x, g, o = (walks[lib, case.key] for lib in LIBRARIES)
        cells = [ms(x.cold), ms(x.fresh), ms(x.cached), ms(g.cold), ms(g.fresh)]
        cells += ["n/a", "n/a"] if o.error else [ms(o.cold), ms(o.fresh)]
        print(f"| ({case.key}) {case.name} | " + " | ".join(cells) + " |")

    print(f"\nNext-token mask (µs), median / max over {args.walks} walks of the valid output")
    print("| case | tokens | xgrammar | llguidance | outlines-core |\n|---|---:|---:|---:|---:|")
    for case in main_cases:
        cells = []
        for lib in LIBRARIES:
            w = walks[lib, case.key]
            if w.error:
                cells.append("n/a")
            elif w.rejected is not None:
                cells.append(f"refused token {w.rejected}")
            else:
                cells.append(f"{statistics.median(w.mask_us):.0f} / {max(w.mask_us):.0f}")
        n = len(hf.encode(case.text, add_special_tokens=False))
        print(f"| ({case.key}) {case.name} | {n} | " + " | ".join(cells) + " |")
    pooled = {lib: [t for case in main_cases for t in walks[lib, case.key].mask_us]
              for lib in LIBRARIES}
    print("| all steps | | " + " | ".join(
        f"{statistics.median(pooled[lib]):.0f} / {max(pooled[lib]):.0f}" for lib in LIBRARIES)
        + " |")

    print("\nApply a bitmask to float32 logits (µs, median; first call in brackets, s)")
    print("| logits | xgr.apply_token_bitmask_inplace | llguidance.torch.apply_... |")
    print("|---|---:|---:|")
    for batch in (1, 16):
        cells = []
        for lib in ("xgrammar", "llguidance"):
            r = apply[f"{lib} [{batch}]"]
            cells.append("error" if "error" in r else
                         f"{r['median_us']:.0f} ({r['first_s']:.2f} s)")
        print(f"| [{batch}, {VOCAB}] | " + " | ".join(cells) + " |")

    print("\nAgreement of allowed-token sets at each step (specials but eos 2 left out)")
    print("| case | steps | all 3 | xgr=llg | xgr=oc | llg=oc | max diff | stops at end |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    notes, agree = [], {}
    for case in cases:
        case_walks = {lib: walks[lib, case.key] for lib in LIBRARIES}
        row, case_notes = agreement(case, case_walks, hf)
        agree[case.key] = row
        notes += case_notes
        ends = "/".join("y" if w.stops_at_end else "n" for w in case_walks.values())
        if not row:
            trouble = "; ".join(f"{SHORT[lib]} " + ("n/a" if w.error else
                                                    f"refused token {w.rejected}")
                                for lib, w in case_walks.items()
                                if w.error or w.rejected is not None)
            print(f"| ({case.key}) {case.name} | {trouble} | | | | | | {ends} |")
            continue
        print(f"| ({case.key}) {case.name} | {row['steps']} | {row['all']} | "
              f"{row['xgr=llg']} | {row['xgr=oc']} | {row['llg=oc']} | {row['max_diff']} | "
              f"{ends} |")
    print("Ids one library allows and another refuses, over the walk:" if notes
          else "No differences.")
    for note in notes:
        print("  " + (note if len(note) <= 81 else note[:78] + "..."))
    leaks = {lib: {case.key: special_leaks(walks[lib, case.key].masks, stop)
                   for case in cases} for lib in LIBRARIES}
    print("Special tokens allowed as text (a stop id: before the output is complete):")
    for lib in LIBRARIES:
        steps = sum(n for n, _ in leaks[lib].values())
        ids = set().union(*(i for _, i in leaks[lib].values()))
        print(f"  {lib}: {steps} of {sum(len(walks[lib, c.key].masks) for c in cases)} "
              f"steps, ids {id_ranges(ids)}")

    print("\nFeatures (from each library's API; rollback also exercised on every walk)")
    print("| feature | xgrammar | llguidance | outlines-core |\n|---|---|---|---|")
    for feature, row in feature_table.items():
        print(f"| {feature} | " + " | ".join("yes" if row[lib] else "no" for lib in LIBRARIES)
              + " |")

    needed = {"regex": "regex", "JSON schema": "JSON schema", "EBNF grammar": "grammar",
              "rollback": "rollback"}
    eligible = [lib for lib in LIBRARIES if all(feature_table[f][lib] for f in needed)]
    medians = {lib: statistics.median(pooled[lib]) for lib in LIBRARIES}
    if eligible:
        best = min(eligible, key=medians.get)
        others = ", ".join(f"{lib} {medians[lib]:.0f} µs" for lib in eligible if lib != best)
        lacking = "; ".join(f"{lib}: no " + ", ".join(word for f, word in needed.items()
                                                          if not feature_table[f][lib])
                            for lib in LIBRARIES if lib not in eligible)
        recommendation = (f"{best}: median mask {medians[best]:.0f} µs"
                          + (f" vs {others}" if others else "")
                          + (f" ({lacking})" if lacking else ""))
    else:
        recommendation = "none: no library has regex, JSON schema, grammar and rollback"
    print(f"\nUse {recommendation}")

    if args.json:
        data = {
            "machine": describe(), "quiet": problem is None, "threads": args.threads,
            "stop_tokens": stop, "prepare_s": prepare, "apply": apply,
            "features": feature_table, "agreement": agree,
            "special_leaks": {lib: {key: {"steps": n, "ids": sorted(ids)}
                                    for key, (n, ids) in per_case.items()}
                              for lib, per_case in leaks.items()},
            "agreement_notes": notes, "recommendation": recommendation,
            "cases": {case.key: {
                "name": case.name, "text": case.text,
                "libraries": {lib: {
                    "cold_s": walks[lib, case.key].cold, "fresh_s": walks[lib, case.key].fresh,
                    "cached_s": walks[lib, case.key].cached,
                    "mask_us_median": (statistics.median(walks[lib, case.key].mask_us)
                                       if walks[lib, case.key].mask_us else None),
                    "mask_us_max": max(walks[lib, case.key].mask_us, default=None),
                    "refused_step": walks[lib, case.key].rejected,
                    "error": walks[lib, case.key].error,
                    "stops_at_end": walks[lib, case.key].stops_at_end,
                    "rollback_ok": walks[lib, case.key].rollback_ok}
                    for lib in LIBRARIES}} for case in cases},
        }
        with open(args.json, "w") as f:
            json.dump(data, f, indent=1)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
