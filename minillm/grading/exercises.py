"""Generate ``exercises/`` from ``solutions/``: every solution block becomes a stub.

A block between ``### BEGIN SOLUTION`` and ``### END SOLUTION`` (markers on their own
lines, inside a function) is replaced by::

    raise NotImplementedError("Exercise NN.k: <first line of the function's docstring>")

at the marker's indentation. Signatures, docstrings, hints and the rest of the file are
kept. ``python -m minillm.grading.exercises --check`` fails if ``exercises/`` is stale.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from .repository import REPO_ROOT

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
EXERCISE_LINE = re.compile(r"Exercise (\d\d\.\d+): (.+)")
HEADER = '# Generated from solutions/{name} by `python -m minillm.grading.exercises`.\n' \
         '# Fill in the parts that raise NotImplementedError; do not edit the rest.\n'


def _stub(line: str, exercise: str) -> str:
    indent = line[: len(line) - len(line.lstrip())]
    return f'{indent}raise NotImplementedError("{exercise}")\n'


def make_exercise(source: str, name: str = "?") -> str:
    """The student version of one solution file's text."""
    out, exercise, inside = [HEADER.format(name=name)], None, False
    for number, line in enumerate(source.splitlines(keepends=True), start=1):
        found = EXERCISE_LINE.search(line)
        if found and not inside:
            exercise = f"Exercise {found.group(1)}: {found.group(2).strip().rstrip('.')}"
        if line.strip() == BEGIN:
            if inside or exercise is None:
                raise ValueError(f"{name}:{number}: {BEGIN} without an 'Exercise NN.k: ...' "
                                 "docstring line before it, or nested")
            inside = True
            out.append(_stub(line, exercise.replace('"', "'")))
        elif line.strip() == END:
            if not inside:
                raise ValueError(f"{name}:{number}: {END} without {BEGIN}")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise ValueError(f"{name}: {BEGIN} is never closed")
    return "".join(out)


def generate(root: Path = REPO_ROOT, check: bool = False) -> list[str]:
    """Write (or with ``check``, compare) every exercise file; returns the stale ones."""
    stale = []
    for solution in sorted((root / "solutions").glob("ch*.py")):
        target = root / "exercises" / solution.name
        text = make_exercise(solution.read_text(), solution.name)
        if not target.exists() or target.read_text() != text:
            stale.append(target.name)
            if not check:
                target.write_text(text)
    return stale


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if exercises/ is stale")
    args = parser.parse_args(argv)
    stale = generate(check=args.check)
    if args.check and stale:
        print(f"exercises out of date: {', '.join(stale)}; run "
              "`python -m minillm.grading.exercises` and commit.", file=sys.stderr)
        return 1
    print(f"exercises {'checked' if args.check else 'written'}: "
          f"{len(list((REPO_ROOT / 'solutions').glob('ch*.py')))} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
