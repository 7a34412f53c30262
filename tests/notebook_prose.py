"""Which measured numbers a notebook's prose quotes without its outputs backing them.

A number a learner reads in a markdown cell must come from a run: printed by a cell, or
glued from one (MyST-NB ``glue``). A number that only the prose holds goes stale the
next time the notebook runs, and nothing notices. This module finds such numbers.

What counts as a *measured* number in prose: a decimal (``5.9``), a number with
thousands separators (``1,142``), and any number with a unit of measurement (``41%``,
``1.2×``, ``43 s``, ``122 tokens/s``, ``538 MB``...). Plain integers (``16 blocks``,
``128 new tokens``) are settings, not measurements, and are left alone.

A quoted number is *backed* when some number in the notebook's outputs (or in its code:
a setting the prose repeats) rounds to it at the prose's precision: prose ``54%`` is
backed by an output ``54.4%``. Left out of the check: code spans, math, links, glue roles,
exercise and section numbers (``Exercise 12.5``, ``§7.2``, ``Figure 2``), and version
numbers. A number from elsewhere (a paper, a datasheet, another chapter's output, a run recorded in
docs/benchmarks.md) is declared in its cell with its source::

    <!-- constants: 20.4% 96.3% (Kwon et al. 2023, Figure 2) -->
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import nbformat

UNITS = (r"%|×(?!\s*\d)|x\b(?!\s*\d)|ms\b|µs\b|us\b|s\b|seconds?\b|min\b|minutes?\b|hours?\b"
         r"|tokens?/s\b|tok/s\b|requests?/s\b|GB/s\b|TB/s\b|GFLOP/s\b|TFLOP/s\b|TFLOPS\b"
         r"|GFLOPS\b|FLOP/s\b|[KMGT]i?B\b|GHz\b")
NUMBER = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
QUOTED = re.compile(rf"(?<![\w.\-/])(?P<number>{NUMBER})(?:\s*[–-]\s*(?P<upper>{NUMBER}))?"
                    rf"(?P<unit>\s?(?:{UNITS}))?")
NOT_PROSE = re.compile(r"<!--.*?-->|```.*?```|`[^`]*`|\$\$.*?\$\$|\$[^$]*\$"
                       r"|\{glue[^}]*\}`[^`]*`|\]\([^)]*\)|https?://\S+", re.S)
LABELS = re.compile(r"(?:exercises?|§|sec\.|section|chapter|figure|fig\.|table|eq\.|"
                    r"equation|theorem|algorithm|version|v|python|torch|release)\s*$",
                    re.I)
CONSTANTS = re.compile(r"<!--\s*constants:(.*?)-->", re.S)
ANY_NUMBER = re.compile(NUMBER)


@dataclass(frozen=True)
class Unbacked:
    """A measured number the prose quotes and no output (or setting) holds."""

    notebook: str
    cell: int
    quote: str
    context: str

    def __str__(self) -> str:
        return f"{self.notebook} cell {self.cell}: {self.quote!r} in \u201c{self.context}\u201d"


def _value(text: str) -> float:
    return float(text.replace(",", ""))


def _decimals(text: str) -> int:
    return len(text.split(".")[1]) if "." in text else 0


def numbers_in(text: str) -> list[str]:
    return ANY_NUMBER.findall(text)


def backed(quoted: str, known: list[str]) -> bool:
    """Does some known number round to ``quoted`` at its precision?"""
    target, places = _value(quoted), _decimals(quoted)
    return any(abs(_value(k) - target) <= 0.5 * 10 ** -places + 1e-9 for k in known)


def quoted_measurements(markdown: str, chapter: int = 0) -> list[tuple[str, str]]:
    """(number, context) of every measured number the prose of ``markdown`` quotes; in
    chapter ``chapter``, a bare ``12.5`` there is an exercise's label."""
    label = re.compile(rf"0?{chapter}\.\d$")
    prose = NOT_PROSE.sub(" ", markdown)
    quotes = []
    for match in QUOTED.finditer(prose):
        number, upper, unit = match["number"], match["upper"], match["unit"]
        if LABELS.search(prose[max(0, match.start() - 12):match.start()]):
            continue
        if prose[match.end():match.end() + 2].startswith(".") and \
                prose[match.end() + 1:match.end() + 2].isdigit():
            continue  # a version such as 2.13.0
        measured = unit or "." in number or "," in number or (upper and "." in upper)
        if not measured or (not unit and not upper and label.match(number)):
            continue
        context = prose[max(0, match.start() - 40):match.end() + 20].replace("\n", " ")
        quotes += [(n, context.strip()) for n in (number, upper) if n]
    return quotes


def unbacked_numbers(path: Path) -> list[Unbacked]:
    """Every measured number in ``path``'s markdown that its outputs and code do not hold."""
    notebook = nbformat.read(path, as_version=4)
    known = []
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        known += numbers_in(re.sub(r"(?<=\d)_(?=\d)", "", cell.source))  # 200_000
        for output in cell.get("outputs", []):
            known += numbers_in(output.get("text", ""))
            for kind in ("text/plain", "text/markdown", "text/html"):
                known += numbers_in(str(output.get("data", {}).get(kind, "")))
    found = []
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type != "markdown":
            continue
        declared = [n for block in CONSTANTS.findall(cell.source) for n in numbers_in(block)]
        chapter = int(path.name[:2]) if path.name[:2].isdigit() else 0
        for number, context in quoted_measurements(cell.source, chapter):
            if not backed(number, known + declared):
                found.append(Unbacked(path.name, index, number, context))
    return found
