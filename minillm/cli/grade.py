"""``minillm grade [chapter]``: run the graded tests and print the score table."""

from __future__ import annotations

import sys

from ..grading import check_impl
from ..grading.grade import check_honesty, check_mutants, run_graded_tests, score_table


def add_arguments(parser) -> None:
    parser.add_argument("chapter", nargs="?", default=None, help="e.g. 3 (default: all)")
    parser.add_argument("--impl", default="exercises", type=check_impl,
                        help="exercises (default), solutions, or mutant:chNN_topic:name")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds per test (default 60; 20 with --check-mutants)")
    parser.add_argument("--workers", type=int, default=None, help="parallel pytest workers")
    parser.add_argument("--check-honesty", action="store_true",
                        help="CI: every test fails on the stubs and passes on the solutions")
    parser.add_argument("--check-mutants", action="store_true",
                        help="CI: every wrong answer in tests/grading/mutants loses points")


def run(args) -> None:
    if args.check_honesty:
        sys.exit(check_honesty(args.chapter, args.workers))
    if args.check_mutants:
        sys.exit(check_mutants(args.chapter, args.workers, args.timeout or 20))
    results = run_graded_tests(args.chapter, args.impl, args.timeout or 60, args.workers)
    print(f"graded: {args.impl}" + (f", chapter {args.chapter}" if args.chapter else ""))
    print(score_table(results))
