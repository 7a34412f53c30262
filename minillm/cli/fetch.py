"""``minillm fetch``: prepare the course model and the text corpora, or another model (once).

    minillm fetch                  # SmolLM2-135M-Instruct and the corpora
    minillm fetch gemma3-270m      # Gemma 3 270M (base): ~240 MB download, minutes to convert
"""

from __future__ import annotations

from ..assets import fetch_course_model
from ..assets.gemma import GEMMA3_NAME, fetch_gemma3
from ..data import CORPORA, fetch_corpus

MODELS = {"smollm2": fetch_course_model, GEMMA3_NAME: fetch_gemma3}


def add_arguments(parser) -> None:
    parser.add_argument("model", nargs="?", choices=sorted(MODELS),
                        help="fetch only this model (default: the course model and corpora)")
    parser.add_argument("--force", action="store_true", help="convert the model again")


def run(args) -> None:
    if args.model is not None:
        print(f"{args.model}: {MODELS[args.model](force=args.force)}")
        return
    print(f"course model: {fetch_course_model(force=args.force)}")
    for name in CORPORA:
        print(f"corpus {name}: {fetch_corpus(name)}")
