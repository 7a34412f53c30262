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

This file runs the benchmark and prints its tables; the libraries' common interface and
the cases are in ``structured_libraries.py``, the measurements in ``structured_walks.py``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

if not __package__:  # run as a script: make the helpers beside it importable as benchmarks.*
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.structured_libraries import (  # noqa: E402
    CASES,
    LIBRARIES,
    VOCAB,
    Case,
    LLGuidance,
    OutlinesCore,
    XGrammar,
    features,
    timed,
)
from benchmarks.structured_walks import (  # noqa: E402
    SHORT,
    Walk,
    agreement,
    apply_times,
    id_ranges,
    special_leaks,
    walk,
)
from minillm import Tokenizer  # noqa: E402
from minillm.machine import describe, quiet_problem  # noqa: E402

__all__ = ["Case", "LLGuidance", "OutlinesCore", "XGrammar", "main", "walk"]  # notebook 16


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
