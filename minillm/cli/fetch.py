"""``minillm fetch``: prepare the course model and the text corpora (once)."""

from __future__ import annotations

from ..assets import fetch_course_model
from ..data import CORPORA, fetch_corpus


def add_arguments(parser) -> None:
    parser.add_argument("--force", action="store_true", help="convert the model again")


def run(args) -> None:
    print(f"course model: {fetch_course_model(force=args.force)}")
    for name in CORPORA:
        print(f"corpus {name}: {fetch_corpus(name)}")
