"""Where the course repository is (grading runs from a clone of it), and which
implementation of the exercises is under test."""

from __future__ import annotations

import os
from pathlib import Path

IMPLS = ("exercises", "solutions")
REPO_ROOT = Path(__file__).resolve().parents[2]


def check_impl(impl: str) -> str:
    """``impl`` if it names an implementation, else a ValueError listing the choices."""
    if impl in IMPLS or (impl.startswith("mutant:") and impl.count(":") == 2):
        return impl
    raise ValueError(f"implementation {impl!r}: choose exercises, solutions or "
                     "mutant:chNN_topic:name (see tests/grading/mutants/)")


def current_impl() -> str:
    return check_impl(os.environ.get("MINILLM_IMPL", "exercises"))
