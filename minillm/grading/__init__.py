"""The course's autograding: exercises generated from solutions, graded tests, scores.

* ``solutions/chNN_topic.py`` hold reference code; each exercise is a function whose
  docstring starts with ``Exercise NN.k: what to implement`` and whose body holds a
  ``### BEGIN SOLUTION`` / ``### END SOLUTION`` block (:mod:`.exercises` turns it into a stub).
* ``tests/grading/test_chNN_*.py`` are written once and import the code under test with
  :func:`load_impl`, which reads ``MINILLM_IMPL`` (``exercises`` by default, or ``solutions``).
* ``minillm grade`` runs them in a subprocess and prints a score table (:mod:`.grade`).
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

IMPLS = ("exercises", "solutions")
REPO_ROOT = Path(__file__).resolve().parents[2]


def current_impl() -> str:
    impl = os.environ.get("MINILLM_IMPL", "exercises")
    if impl not in IMPLS:
        raise ValueError(f"MINILLM_IMPL={impl!r}; choose one of {', '.join(IMPLS)}")
    return impl


def load_impl(module: str, impl: str | None = None):
    """Import ``exercises.<module>`` or ``solutions.<module>`` from the course repository.

    ``impl`` defaults to ``$MINILLM_IMPL`` (``exercises`` unless set): your own code.
    """
    impl = impl or current_impl()
    if impl not in IMPLS:
        raise ValueError(f"impl={impl!r}; choose one of {', '.join(IMPLS)}")
    if not (REPO_ROOT / impl).is_dir():
        raise FileNotFoundError(f"{REPO_ROOT / impl} not found: grading runs from a clone of "
                                "the course repository.")
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    return importlib.import_module(f"{impl}.{module}")
