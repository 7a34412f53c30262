"""``minillm grade``: run the graded tests in a subprocess and print a score table.

The subprocess keeps a student's crash from taking the grader down, and pytest-timeout
turns an endless loop into a failed test with a readable reason.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

from . import IMPLS, REPO_ROOT


class GradingError(RuntimeError):
    """The graded tests could not be run at all."""


def graded_files(chapter: str | None = None, root: Path = REPO_ROOT) -> list[Path]:
    grading_dir = root / "tests" / "grading"
    try:
        pattern = f"test_ch{int(chapter):02d}_*.py" if chapter else "test_ch*.py"
    except ValueError:
        raise GradingError(f"chapter must be a number like 3, got {chapter!r}") from None
    files = sorted(grading_dir.glob(pattern))
    if not files:
        raise GradingError(f"no graded tests match chapter {chapter!r} in {grading_dir}")
    return files


def run_graded_tests(chapter: str | None = None, impl: str = "exercises",
                     timeout: float = 60, workers: int | None = None,
                     root: Path = REPO_ROOT) -> list[dict]:
    """One dict per graded test: exercise, points, test, outcome, reason.

    ``root`` is the course repository (its ``tests/conftest.py`` defines ``--impl``).
    """
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {', '.join(IMPLS)}, got {impl!r}")
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "grade.json"
        cmd = [sys.executable, "-m", "pytest", *map(str, graded_files(chapter, root)), "-q",
               "-p", "minillm.grading.plugin", f"--grade-report={report}", f"--impl={impl}",
               f"--timeout={timeout}", "-p", "no:cacheprovider", "-W", "ignore"]
        if workers:
            cmd += ["-n", str(workers), "--dist", "loadfile"]
        done = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
        if not report.exists():
            raise GradingError("the graded tests did not run:\n" + done.stdout[-2000:]
                               + done.stderr[-2000:])
        return json.loads(report.read_text())


def score_table(results: list[dict]) -> str:
    """Per exercise: points earned / possible, PASS or FAIL, the first failure's reason."""
    by_exercise: dict[str, list[dict]] = defaultdict(list)
    for r in results:
        by_exercise[r["exercise"]].append(r)
    rows = [f"{'exercise':<10} {'points':>11}  result  reason", "-" * 72]
    earned_total = possible_total = 0
    for exercise in sorted(by_exercise):
        tests = by_exercise[exercise]
        earned = sum(t["points"] for t in tests if t["outcome"] == "passed")
        possible = sum(t["points"] for t in tests)
        failures = [t for t in tests if t["outcome"] != "passed"]
        reason = f"{failures[0]['test']}: {failures[0]['reason']}" if failures else ""
        verdict = "FAIL" if failures else "PASS"
        rows.append(f"{exercise:<10} {earned:>4.1f} / {possible:<4.1f} {verdict:>5}  {reason[:90]}")
        earned_total, possible_total = earned_total + earned, possible_total + possible
    rows += ["-" * 72, f"{'total':<10} {earned_total:>4.1f} / {possible_total:<4.1f}"]
    return "\n".join(rows)


def check_honesty(workers: int | None = None) -> int:
    """Every graded test must FAIL on the stubs and PASS on the solutions. Returns 0 if so."""
    solutions = run_graded_tests(impl="solutions", workers=workers)
    stubs = run_graded_tests(impl="exercises", workers=workers)
    bad_solutions = [r for r in solutions if r["outcome"] != "passed"]
    passing_stubs = [r for r in stubs if r["outcome"] == "passed"]
    print(f"graded tests: {len(solutions)}; pass on solutions: "
          f"{len(solutions) - len(bad_solutions)}; fail on stubs: "
          f"{len(stubs) - len(passing_stubs)} of {len(stubs)}")
    for r in bad_solutions:
        print(f"  FAILS ON SOLUTIONS: {r['exercise']} {r['test']}: {r['reason']}")
    for r in passing_stubs:
        print(f"  PASSES ON A STUB (asserts nothing?): {r['exercise']} {r['test']}")
    ok = solutions and not bad_solutions and not passing_stubs and len(stubs) == len(solutions)
    return 0 if ok else 1
