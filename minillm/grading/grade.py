"""``minillm grade``: run the graded tests in a subprocess and print a score table.

The subprocess keeps a student's crash from taking the grader down, and pytest-timeout
turns an endless loop into a failed test with a readable reason. Two checks keep the
graded tests honest: :func:`check_honesty` (every test fails on the stubs and passes on
the solutions) and :func:`check_mutants` (every plausible wrong answer loses points).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .mutants import MUTANTS_DIR, find_mutants, graded_module, solution_exercises
from .repository import REPO_ROOT, check_impl


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

    ``impl``: exercises, solutions or mutant:chNN_topic:name; ``root`` is the course
    repository.
    """
    files = graded_files(chapter, root)
    cmd = ["-p", "minillm.grading.plugin"] + (["-n", str(workers), "--dist", "loadfile"]
                                              if workers else [])
    return _run_pytest(files, cmd, "grade", check_impl(impl), timeout, root)


def _run_pytest(files: list[Path], options: list[str], report_option: str, impl: str,
                timeout: float, root: Path, exit_codes: tuple[int, ...] | None = None):
    """Run pytest on ``files`` in a subprocess; returns what the plugin wrote to
    ``--<report_option>-report``. With ``exit_codes``, any other exit status of pytest (a
    collection error, say) raises GradingError."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pytest", *map(str, files), "-q", *options,
               f"--{report_option}-report={report}", f"--timeout={timeout}",
               "-p", "no:cacheprovider", "-W", "ignore"]
        done = subprocess.run(cmd, cwd=root, capture_output=True, text=True,
                              env={**os.environ, "MINILLM_IMPL": impl})
        if not report.exists() or (exit_codes and done.returncode not in exit_codes):
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


def check_honesty(chapter: str | None = None, workers: int | None = None) -> int:
    """Every graded test (of ``chapter``, or all) must FAIL on the stubs and PASS on the
    solutions. Returns 0 if so."""
    solutions = run_graded_tests(chapter, impl="solutions", workers=workers)
    stubs = run_graded_tests(chapter, impl="exercises", workers=workers)
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


def run_mutants(chapter: str | None = None, workers: int | None = None, timeout: float = 20,
                mutants_dir: Path = MUTANTS_DIR, root: Path = REPO_ROOT) -> list[dict]:
    """Grade every mutant of the chapter(s); one dict per mutant: module, name, exercise,
    mistake, tests (how many graded tests it ran), killed_by (its first failure, or None).

    Each of the ``workers`` pytest subprocesses takes a share of the chapters and tries
    their mutants in turn (:mod:`.mutant_plugin`): torch is imported once per worker.
    """
    files = graded_files(chapter, root)
    modules = dict.fromkeys(graded_module(test_file) for test_file in files)  # parts: once
    mutants = [m for module in modules for m in find_mutants(module, mutants_dir, root)]
    options = ["-p", "minillm.grading.mutant_plugin", f"--mutants-dir={mutants_dir}"]
    workers = workers or 1

    def run_share(share: list[Path]) -> dict:
        return _run_pytest(share, options, "mutant", "solutions", timeout, root,
                           exit_codes=(0, 1, 5))  # passed, failed, or no test to run

    with ThreadPoolExecutor(max_workers=workers) as pool:
        reports = merge_mutant_reports(
            pool.map(run_share, [files[i::workers] for i in range(workers)]))
    return [{"module": m.module, "name": m.name, "exercise": m.exercise, "mistake": m.mistake,
             **reports.get(f"{m.module}.{m.name}", {"tests": 0, "killed_by": None})}
            for m in mutants]


def merge_mutant_reports(reports) -> dict:
    """One result per mutant from the workers' reports. A module's graded tests may be
    split into parts (``test_<module>__<part>.py``) that different workers run, so one
    mutant can appear in several reports: its tests add up, and it is killed if any part
    killed it."""
    merged: dict[str, dict] = {}
    for report in reports:
        for key, result in report.items():
            total = merged.setdefault(key, {"tests": 0, "killed_by": None})
            total["tests"] += result["tests"]
            total["killed_by"] = total["killed_by"] or result["killed_by"]
    return merged


def mutant_summary(results: list[dict], exercises: list[str]) -> tuple[list[str], bool]:
    """Lines to print (one per surviving mutant, exercises with fewer than 2 mutants, the
    count) and whether the graded tests kill every mutant of every exercise, >= 2 each."""
    survivors = [r for r in results if not r["killed_by"]]
    lines = [f"SURVIVES {r['exercise']} {r['module']}.{r['name']}: {r['mistake']} "
             f"({r['tests']} graded tests passed)" for r in survivors]
    per_exercise = {exercise: 0 for exercise in exercises}
    for r in results:
        per_exercise[r["exercise"]] = per_exercise.get(r["exercise"], 0) + 1
    too_few = {e: n for e, n in sorted(per_exercise.items()) if n < 2}
    lines += [f"TOO FEW MUTANTS {e}: {n} (write at least 2 plausible wrong answers)"
              for e, n in too_few.items()]
    lines.append(f"mutants killed: {len(results) - len(survivors)} of {len(results)} "
                 f"(>= 2 per exercise: {'no' if too_few else 'yes'})")
    return lines, bool(results) and not survivors and not too_few


def check_mutants(chapter: str | None = None, workers: int | None = None,
                  timeout: float = 20) -> int:
    """Every mutant must fail at least one graded test of its exercise, and every exercise
    needs at least 2 mutants. Prints the survivors and a count; returns 0 if all is well."""
    results = run_mutants(chapter, workers, timeout)
    pattern = f"ch{int(chapter):02d}_*.py" if chapter else "ch*.py"
    exercises = [exercise for path in sorted((REPO_ROOT / "solutions").glob(pattern))
                 for exercise in solution_exercises(path.stem).values()]
    lines, ok = mutant_summary(results, exercises)
    print("\n".join(lines))
    return 0 if ok else 1
