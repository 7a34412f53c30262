"""The course's autograding: exercises generated from solutions, graded tests, scores.

* ``solutions/chNN_topic.py`` hold reference code; each exercise is a function whose
  docstring starts with ``Exercise NN.k: what to implement`` and whose body holds a
  ``### BEGIN SOLUTION`` / ``### END SOLUTION`` block (:mod:`.exercises` turns it into a stub).
* ``tests/grading/test_chNN_*.py`` (a long one split into ``test_chNN_topic__part.py``
  files) are written once and import the code under test with
  :func:`load_impl`, which reads ``MINILLM_IMPL``: ``exercises`` (the default, your code),
  ``solutions``, or ``mutant:chNN_topic:name``, the solutions with one function replaced
  by a plausible wrong answer from ``tests/grading/mutants/`` (:mod:`.mutants`).
* ``minillm grade`` runs them in a subprocess and prints a score table (:mod:`.grade`).
"""

from __future__ import annotations

import importlib
import sys

from .mutants import find_mutant, mutated_solution
from .repository import IMPLS, REPO_ROOT, check_impl, current_impl

__all__ = ["IMPLS", "REPO_ROOT", "check_impl", "current_impl", "load_impl"]


def load_impl(module: str, impl: str | None = None):
    """Import ``exercises.<module>`` or ``solutions.<module>`` from the course repository.

    ``impl`` defaults to ``$MINILLM_IMPL`` (``exercises`` unless set): your own code.
    ``mutant:<module>:<name>`` gives a copy of the solutions in which one function is the
    mutant ``name``; other modules are then the plain solutions.
    """
    impl = check_impl(impl or current_impl())
    folder = "exercises" if impl == "exercises" else "solutions"
    if not (REPO_ROOT / folder).is_dir():
        raise FileNotFoundError(f"{REPO_ROOT / folder} not found: grading runs from a clone "
                                "of the course repository.")
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    if impl.startswith("mutant:") and impl.split(":")[1] == module:
        return mutated_solution(find_mutant(module, impl.split(":")[2]))
    return importlib.import_module(f"{folder}.{module}")
