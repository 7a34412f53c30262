"""The built course website, opened in a real browser (headless Chromium).

Run after `make book`. Every page of book/_toc.yml is opened at 1280 pixels wide; a
screenshot of the whole page and its DOM after scripts ran are saved in
book/_build/browser/ for people to look at. Each page must run its scripts without
errors, typeset all its math, not scroll sideways, and show every printed table whole:
output lines wrap inside their box (book/_static/minillm.css), which is right for running
text but scrambles a table, so a table row must fit the box.
"""

from __future__ import annotations

import re

import pytest
from book_site import ARTIFACTS, WIDTH, Rendered, cell_start, render, section_of

# A printed line with two or more gaps of 2+ spaces between words is a row of a table.
TABLE_GAP = re.compile(r"(?<=\S) {2,}(?=\S)")


@pytest.fixture
def open_page(site_url, tmp_path):
    def run(page: str) -> Rendered:
        return render(f"{site_url}/{page}.html", page.replace("/", "__"), tmp_path / "profile")
    return run


def wide_table_rows(rendered: Rendered) -> list[str]:
    """Printed table rows longer than their output box holds at WIDTH pixels, by cell."""
    by_cell = {}  # cell -> (characters the box holds, rows too long)
    for pre in rendered.soup.select("div.cell_output pre[data-fits-chars]"):
        fits = int(pre["data-fits-chars"])
        rows = [line for line in pre.get_text().splitlines()
                if len(line) > fits and len(TABLE_GAP.findall(line)) >= 2]
        if rows:
            cell = pre.find_parent("div", class_="cell")
            by_cell.setdefault(id(cell), (cell, fits, []))[2].extend(rows)
    return [f"section {section_of(cell)!r}, cell {cell_start(cell)!r}: {len(rows)} rows up to "
            f"{max(map(len, rows))} characters, the box holds {fits}; e.g. {rows[0][:60]!r}..."
            for cell, fits, rows in by_cell.values()]


def test_page_in_browser(page, open_page):
    rendered = open_page(page)
    body = rendered.soup.body
    problems = [f"console: {error}" for error in rendered.console_errors]
    problems += [f"MathJax error in section {section_of(error)!r}: {error.get_text()!r}"
                 for error in rendered.soup.select("mjx-merror")]
    problems += [f"math not typeset in section {section_of(math)!r}: {math.get_text()[:80]!r}"
                 for math in rendered.soup.select(".math") if not math.select("mjx-container")]
    if int(body["data-page-width"]) > WIDTH:
        problems.append(f"the page is {body['data-page-width']} px wide at a {WIDTH} px window:"
                        " it scrolls sideways")
    problems += [f"table too wide: {row}" for row in wide_table_rows(rendered)]
    assert rendered.screenshot.stat().st_size > 20_000, "screenshot is (nearly) blank"
    assert not problems, (f"{page} (screenshot {rendered.screenshot.relative_to(ARTIFACTS.parent)})"
                          ":\n  " + "\n  ".join(problems))


def test_home_page_renders(open_page):
    dom = open_page("intro").dom
    assert "LLM inference from the ground up" in dom
    assert "Anatomy of inference" in dom  # the table of contents lists the chapters
    assert "Exercises and grading" in dom


def test_chapter_page_shows_figures_and_outputs(open_page):
    dom = open_page("notebooks/03_kv_cache").dom
    assert "<h1" in dom and "KV cache" in dom
    assert "<img" in dom and ("image/png" in dom or "_images/" in dom)  # a stored figure
    assert "cell_output" in dom  # a code cell's stored output is shown
    assert "mjx-container" in dom  # equations rendered by MathJax (served with the site)
