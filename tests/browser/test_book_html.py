"""The built course website as HTML files (run after `make book`; no browser needed).

Every page of book/_toc.yml must exist, show no raw TeX, link only to pages and anchors
that exist, load nothing from the internet (the site works offline), and show no
ipywidgets widget (the book has no kernel, so a widget cell is code that does nothing).
A failure names the page, the section and the text or cell, for whoever fixes the notebook.
"""

from __future__ import annotations

import functools
import os
import re
from urllib.parse import unquote, urlsplit

from book_site import REPO, SITE, cell_start, page_html, section_of, toc_pages
from bs4 import BeautifulSoup, Comment

# Text inside these is not prose: `$` is legitimate in code, in printed output and inside
# math that MathJax typesets.
NOT_PROSE = {"script", "style", "pre", "code", "kbd", "samp", "mjx-container"}
NOT_PROSE_CLASSES = {"cell_input", "cell_output", "math", "highlight"}
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
MONEY = re.compile(r"(?<![\w$])\$\d")  # "$2 per hour": a dollar sign, not math


def is_prose(text) -> bool:
    if isinstance(text, Comment):
        return False
    return not any(parent.name in NOT_PROSE or NOT_PROSE_CLASSES & set(parent.get("class", []))
                   for parent in text.parents)


def article(page: str):
    """The page's main text, without the sidebars and navigation."""
    soup = page_html(page)
    return soup.select_one("article.bd-article") or soup.body


def test_every_toc_page_is_built():
    missing = [page for page in toc_pages() if not (SITE / f"{page}.html").exists()]
    assert not missing, f"pages of book/_toc.yml without HTML (run make book): {missing}"


def test_home_page_links_every_chapter():
    home = article("intro")
    links = {a["href"] for a in home.select("a[href]")}
    chapters = [page for page in toc_pages() if page.startswith("notebooks/")]
    unlinked = [page for page in chapters if f"{page}.html" not in links]
    assert not unlinked, f"book/intro.md's chapter list does not link {unlinked}"


def test_no_raw_math(page):
    """No `$` left in prose: MyST turned every `$...$` and `$$...$$` into math.

    An amount of money (`\\$2` in the Markdown, `$2` on the page) is not math.
    """
    problems = {}  # one line per paragraph, however many `$` it shows
    for text in article(page).find_all(string=re.compile(r"\$")):
        if is_prose(text) and "$" in MONEY.sub("", text):
            block = text.find_parent(["p", "li", "td", "th", "dt", "dd"]) or text.parent
            context = " ".join(block.get_text(" ").split())
            problems[id(block)] = f"section {section_of(text)!r}: {context[:300]!r}"
    problems = list(problems.values())
    assert not problems, (f"{page}: raw `$` (unrendered math) in the text:\n  "
                          + "\n  ".join(problems))


@functools.cache
def anchors(path) -> set[str]:
    soup = BeautifulSoup(path.read_text(), "html.parser")
    return {tag["id"] for tag in soup.select("[id]")} | {a["name"] for a in soup.select("a[name]")}


def test_internal_links_resolve(page):
    """Every link and image to a local file finds the file, and its #anchor on that page."""
    here = SITE / f"{page}.html"
    problems = []
    for tag, attribute in (("a", "href"), ("img", "src"), ("link", "href"), ("script", "src")):
        for element in page_html(page).select(f"{tag}[{attribute}]"):
            url = urlsplit(element[attribute])
            if url.scheme or url.netloc:
                continue  # another site: see test_loads_nothing_from_the_internet
            target = (here.parent / unquote(url.path)).resolve() if url.path else here
            if target.is_dir():
                target = target / "index.html"
            where = f"{element[attribute]} ({tag} in section {section_of(element)!r})"
            if not target.exists():
                problems.append(f"{where}: no file {os.path.relpath(target, REPO)}")
            elif url.fragment and target.suffix == ".html" and url.fragment not in anchors(target):
                problems.append(f"{where}: no id {url.fragment!r} in {target.name}")
    assert not problems, f"{page}: broken internal links:\n  " + "\n  ".join(problems)


def test_loads_nothing_from_the_internet(page):
    """Scripts, styles and images come with the site, so the book works offline."""
    soup = page_html(page)
    remote = [element.get("src") or element.get("href")
              for element in soup.select("script[src], link[rel=stylesheet][href], img[src]")
              if urlsplit(element.get("src") or element.get("href")).netloc]
    assert not remote, f"{page} loads from the internet: {remote}"


def test_no_widgets(page):
    """A widget needs a kernel; in the book its cell is code that does nothing.

    Tag such a cell `remove-cell` (Jupyter Book then leaves it out of the site; JupyterLab
    still runs it) and keep the static version after it, which the book shows instead.
    """
    problems = []
    for cell in article(page).select("div.cell"):
        output = cell.select_one("div.cell_output")
        if output is None:
            continue
        text = output.get_text()
        if output.select(f'script[type="{WIDGET_VIEW}"]') or re.search(r"\w+\(children=\(", text):
            problems.append(f"section {section_of(cell)!r}, cell {cell_start(cell)!r}")
    assert not problems, (f"{page}: ipywidgets cells shown in the book (tag them remove-cell; "
                          "put any function they define in a cell of its own):\n  "
                          + "\n  ".join(problems))
