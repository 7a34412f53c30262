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

A chapter whose tests or mutants would make one file too long splits them into parts
named ``<module>__<part>.py``: ``tests/grading/test_ch14_parallel__pipeline.py`` grades
``solutions/ch14_parallel.py`` (:func:`graded_module`), and the mutants of a module are
those of ``mutants/<module>.py`` and of every ``mutants/<module>__<part>.py``.
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


def graded_module(test_file: Path | str) -> str:
    """The solutions module a graded test file grades: ``test_ch09_sparsity.py`` and
    ``test_ch14_parallel__pipeline.py`` (a part) -> ``ch09_sparsity``, ``ch14_parallel``."""
    return Path(test_file).stem.removeprefix("test_").split("__")[0]


def mutant_files(module: str, mutants_dir: Path = MUTANTS_DIR) -> list[Path]:
    """``mutants/<module>.py``, then its parts ``mutants/<module>__<part>.py``, those that
    exist."""
    mutants_dir = Path(mutants_dir)
    return [path for path in [mutants_dir / f"{module}.py",
                              *sorted(mutants_dir.glob(f"{module}__*.py"))] if path.exists()]


@dataclass(frozen=True)
class Mutant:
    """One wrong answer: ``name`` replaces the function ``function`` of solutions/``module``."""

    module: str  # "ch09_sparsity"
    name: str  # "magnitude_mask__threshold"
    exercise: str  # "09.1", the exercise of the replaced function
    mistake: str  # the first line of the mutant's docstring
    path: Path  # the file it is written in, mutants/<module>.py or one of its parts

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
    """The mutants of solutions/<module>.py in file order, its parts after it (none if there
    is no mutant file).

    Raises ValueError for a mutant that names no exercise function, has no docstring, or
    has the name of another mutant of the module.
    """
    paths = mutant_files(module, mutants_dir)
    if not paths:
        return []
    exercises = solution_exercises(module, root)
    mutants: dict[str, Mutant] = {}
    for path in paths:
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.FunctionDef | ast.ClassDef) or \
                    "__" not in node.name.strip("_"):
                continue  # a helper, not a mutant
            function, doc = node.name.split("__")[0], ast.get_docstring(node)
            if function not in exercises:
                raise ValueError(f"{path}: {node.name} replaces {function}(), which is not "
                                 f"an exercise of solutions/{module}.py")
            if not doc:
                raise ValueError(f"{path}: {node.name} needs a docstring naming its mistake")
            if node.name in mutants:
                raise ValueError(f"{path}: {node.name} is also in {mutants[node.name].path}")
            mutants[node.name] = Mutant(module, node.name, exercises[function],
                                        doc.splitlines()[0], path)
    return list(mutants.values())


def find_mutant(module: str, name: str) -> Mutant:
    for mutant in find_mutants(module):
        if mutant.name == name:
            return mutant
    raise ValueError(f"no mutant {name!r} in {MUTANTS_DIR / module}.py or its parts")


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
    module = _import_file(mutant.path, f"minillm_mutants.{mutant.path.stem}")
    return getattr(module, mutant.name)


def mutated_solution(mutant: Mutant, root: Path = REPO_ROOT) -> ModuleType:
    """A fresh copy of solutions/<module>.py whose function ``mutant.function`` is the
    mutant (the imported solutions module is left as it is)."""
    copy = _import_file(root / "solutions" / f"{mutant.module}.py",
                        f"solutions.{mutant.module}.{mutant.name}")
    setattr(copy, mutant.function, mutant_function(mutant))
    return copy
