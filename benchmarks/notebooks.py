"""Execute every course notebook in place (fresh kernel, top to bottom) and time each one.

    python benchmarks/notebooks.py                 # all of notebooks/NN_*.ipynb
    python benchmarks/notebooks.py 03_kv_cache     # just one

Outputs are written back into the notebooks (they are committed and checked by nbval).
Prints a markdown table of execution times for docs/benchmarks.md, with the machine's name.
Timings are only honest on a quiet machine: before each notebook the script checks that
nothing else uses the cores (:func:`minillm.machine.quiet_problem`) and refuses to go on
otherwise; ``--busy-ok`` executes anyway and marks the table as not for the record.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from minillm.machine import describe, quiet_problem

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def execute(path: Path, timeout: int = 600) -> float:
    """Run one notebook in a fresh kernel from its own folder; returns seconds taken."""
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(notebook, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    start = time.perf_counter()
    client.execute()
    seconds = time.perf_counter() - start
    nbformat.write(notebook, path)
    return seconds


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="notebook names without .ipynb (default: all)")
    parser.add_argument("--busy-ok", action="store_true",
                        help="execute on a busy machine too (the times are then not recorded)")
    args = parser.parse_args(argv)
    paths = ([NOTEBOOKS / f"{n}.ipynb" for n in args.names] if args.names
             else sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")))
    rows = []
    for path in paths:
        if not args.busy_ok and (problem := quiet_problem()) is not None:
            raise SystemExit(f"not executing {path.name}: {problem}")
        seconds = execute(path)
        print(f"{path.name}: {seconds:.0f} s", flush=True)
        rows.append((path.name, seconds))
    record = "busy machine: NOT for the record" if args.busy_ok else "quiet machine"
    print(f"\n{describe()}, {record}\n\n| notebook | execution time (s) |\n|---|---:|")
    for name, seconds in rows:
        print(f"| {name} | {seconds:.0f} |")


if __name__ == "__main__":
    main()
