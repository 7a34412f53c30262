"""Mutants: plausible wrong answers to the exercises, which the graded tests must catch.

A graded test that passes on a wrong implementation gives a learner full points for a bug.
``tests/grading/mutants/chNN_topic.py`` holds, for each exercise of
``solutions/chNN_topic.py``, small functions named ``<solution function>__<mistake>``
with the solution function's signature (or, for an exercise that is a class, classes
named ``<solution class>__<mistake>`` with its interface) and a one-line docstring naming
the mistake::

    def magnitude_mask__threshold(weight, sparsity):
        \"\"\"Keeps |w| > the k-th smallest |w|: prunes more than k weights when they tie.\"\"\"
        ...

``MINILLM_IMPL=mutant:ch09_sparsity:magnitude_mask__threshold`` (or ``minillm grade 9
--impl mutant:...``) grades the solutions with that one function replaced, and
``minillm grade --check-mutants`` proves that every mutant loses points.
Mutant files are read with :mod:`ast` to list them; they are imported only to run one.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from .exercises import EXERCISE_LINE
from .repository import REPO_ROOT

MUTANTS_DIR = REPO_ROOT / "tests" / "grading" / "mutants"


@dataclass(frozen=True)
class Mutant:
    """One wrong answer: ``name`` replaces the function ``function`` of solutions/``module``."""

    module: str  # "ch09_sparsity"
    name: str  # "magnitude_mask__threshold"
    exercise: str  # "09.1", the exercise of the replaced function
    mistake: str  # the first line of the mutant's docstring
    mutants_dir: Path = MUTANTS_DIR

    @property
    def function(self) -> str:
        return self.name.split("__")[0]

    @property
    def impl(self) -> str:
        """The ``MINILLM_IMPL`` value that grades this mutant."""
        return f"mutant:{self.module}:{self.name}"


def solution_exercises(module: str, root: Path = REPO_ROOT) -> dict[str, str]:
    """{name: exercise "NN.k"} for the exercise functions (and classes) of
    solutions/<module>.py."""
    tree = ast.parse((root / "solutions" / f"{module}.py").read_text())
    exercises = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            found = EXERCISE_LINE.match(ast.get_docstring(node) or "")
            if found:
                exercises[node.name] = found.group(1)
    return exercises


def find_mutants(module: str, mutants_dir: Path = MUTANTS_DIR,
                 root: Path = REPO_ROOT) -> list[Mutant]:
    """The mutants of solutions/<module>.py in file order (none if there is no mutant file).

    Raises ValueError for a mutant that names no exercise function or has no docstring.
    """
    path = Path(mutants_dir) / f"{module}.py"
    if not path.exists():
        return []
    exercises = solution_exercises(module, root)
    mutants = []
    for node in ast.parse(path.read_text()).body:
        if not isinstance(node, ast.FunctionDef | ast.ClassDef) or \
                "__" not in node.name.strip("_"):
            continue  # a helper, not a mutant
        function, doc = node.name.split("__")[0], ast.get_docstring(node)
        if function not in exercises:
            raise ValueError(f"{path}: {node.name} replaces {function}(), which is not an "
                             f"exercise of solutions/{module}.py")
        if not doc:
            raise ValueError(f"{path}: {node.name} needs a docstring naming its mistake")
        mutants.append(Mutant(module, node.name, exercises[function], doc.splitlines()[0],
                              Path(mutants_dir)))
    return mutants


def find_mutant(module: str, name: str) -> Mutant:
    for mutant in find_mutants(module):
        if mutant.name == name:
            return mutant
    raise ValueError(f"no mutant {name!r} in {MUTANTS_DIR / module}.py")


@functools.cache
def _import_file(path: Path, module_name: str) -> ModuleType:
    """Import the file ``path`` as ``module_name`` (registered in ``sys.modules`` first, as
    an import does: a dataclass in it looks its module up there)."""
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def mutant_function(mutant: Mutant):
    """The mutant itself, imported from its file."""
    module = _import_file(mutant.mutants_dir / f"{mutant.module}.py",
                          f"minillm_mutants.{mutant.module}")
    return getattr(module, mutant.name)


def mutated_solution(mutant: Mutant, root: Path = REPO_ROOT) -> ModuleType:
    """A fresh copy of solutions/<module>.py whose function ``mutant.function`` is the
    mutant (the imported solutions module is left as it is)."""
    copy = _import_file(root / "solutions" / f"{mutant.module}.py",
                        f"solutions.{mutant.module}.{mutant.name}")
    setattr(copy, mutant.function, mutant_function(mutant))
    return copy
