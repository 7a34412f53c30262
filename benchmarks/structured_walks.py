"""What benchmarks/structured_backends.py measures: a walk of one library along a case's
valid output (compile and mask times, the masks, rollback), the agreement of the
libraries' masks step by step, special tokens let through as text, and the time to apply
a bitmask to logits."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from functools import partial

import llguidance.torch
import numpy as np
import torch
import xgrammar as xgr

from benchmarks.structured_libraries import (
    LIBRARIES,
    NUM_SPECIAL,
    VOCAB,
    XGrammar,
    allowed,
    gpt2_byte_decoder,
    timed,
)

SHORT = {"xgrammar": "xgr", "llguidance": "llg", "outlines-core": "oc"}
PAIRS = [("xgrammar", "llguidance"), ("xgrammar", "outlines-core"),
         ("llguidance", "outlines-core")]


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

