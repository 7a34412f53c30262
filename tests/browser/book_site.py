"""Shared pieces of the website checks: the pages of book/_toc.yml, the built HTML, a web
server for the built site that adds a measuring script, and headless Chromium."""

from __future__ import annotations

import functools
import http.server
import io
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from bs4 import BeautifulSoup
from devtools import find_chromium

REPO = Path(__file__).resolve().parents[2]
BOOK = REPO / "book"
SITE = BOOK / "_build" / "html"
ARTIFACTS = BOOK / "_build" / "browser"  # screenshots and rendered DOMs, for people to look at
WIDTH = 1280  # the window width at which layout is checked and screenshots are taken
MAX_SHOT_HEIGHT = 32_000  # pixels; a whole chapter is 10 000 to 25 000
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--hide-scrollbars",
                  "--virtual-time-budget=10000"]

# Added before </body> of every page the test server sends. Once MathJax has typeset the
# page it records what only a browser knows: the page's size, and for each printed output
# how many characters of its font fit on one line of its box. The results land in the DOM
# (data-* attributes), which `chromium --dump-dom` prints.
PROBE = """<script>
window.addEventListener("load", () => {
  const measure = () => {
    for (const pre of document.querySelectorAll("div.cell_output pre")) {
      const style = getComputedStyle(pre);
      const ruler = document.createElement("span");
      ruler.style.cssText = "position:absolute; visibility:hidden; white-space:pre;"
        + "font:" + style.font;
      ruler.textContent = "0".repeat(50);
      document.body.appendChild(ruler);
      const charWidth = ruler.getBoundingClientRect().width / 50;
      ruler.remove();
      const inner = pre.clientWidth - parseFloat(style.paddingLeft)
        - parseFloat(style.paddingRight);
      pre.dataset.fitsChars = Math.floor(inner / charWidth + 0.01);
    }
    document.body.dataset.pageHeight = document.documentElement.scrollHeight;
    document.body.dataset.pageWidth = document.documentElement.scrollWidth;
    document.body.dataset.probed = "yes";
  };
  const typeset = window.MathJax && MathJax.startup && MathJax.startup.promise;
  typeset ? typeset.then(measure, measure) : measure();
});
</script>"""


def toc_pages() -> list[str]:
    """Every page of book/_toc.yml in reading order, as paths without suffix."""
    toc = yaml.safe_load((BOOK / "_toc.yml").read_text())
    pages = [toc["root"]]

    def walk(entries):
        for entry in entries:
            if "file" in entry:
                pages.append(entry["file"])
            for key in ("parts", "chapters", "sections"):
                walk(entry.get(key, []))

    walk([toc])
    return [re.sub(r"\.(md|ipynb)$", "", page) for page in pages]


@functools.cache
def page_html(page: str) -> BeautifulSoup:
    """The built page as Sphinx wrote it (no scripts run; parsed once, do not modify)."""
    path = SITE / f"{page}.html"
    if not path.exists():
        pytest.fail(f"{path.relative_to(REPO)} is missing: build the book first (make book)")
    return BeautifulSoup(path.read_text(), "html.parser")


def section_of(element) -> str:
    """The title of the section an element is in, to say where a problem is."""
    heading = element.find_previous(["h1", "h2", "h3", "h4"])
    return heading.get_text(" ", strip=True).rstrip("#").strip() if heading else "(top)"


def cell_start(cell) -> str:
    """The first line of a code cell's source, to name the cell in a message."""
    code = cell.select_one("div.cell_input pre")
    return code.get_text().strip().splitlines()[0][:70] if code and code.get_text().strip() else "?"



class ProbingHandler(http.server.SimpleHTTPRequestHandler):
    """Serves the built site, with PROBE added to every HTML page."""

    def log_message(self, *args):
        pass

    def send_head(self):
        path = Path(self.translate_path(self.path))
        if path.suffix != ".html" or not path.is_file():
            return super().send_head()
        body = path.read_bytes().replace(b"</body>", PROBE.encode() + b"</body>", 1)
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        return io.BytesIO(body)


class Rendered:
    """One page after Chromium ran its scripts: the DOM, the console's errors, a screenshot."""

    def __init__(self, dom: str, console_errors: list[str], screenshot: Path):
        self.dom = dom
        self.soup = BeautifulSoup(dom, "html.parser")
        self.console_errors = console_errors
        self.screenshot = screenshot


def render(url: str, name: str, profile: Path) -> Rendered:
    """Open url in headless Chromium; save ARTIFACTS/<name>.html (the DOM after scripts ran)
    and ARTIFACTS/<name>.png (the whole page, WIDTH pixels wide)."""
    common = [find_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}"]
    result = subprocess.run([*common, f"--window-size={WIDTH},1600", "--enable-logging=stderr",
                             "--v=0", "--dump-dom", url],
                            capture_output=True, text=True, timeout=180, check=True)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / f"{name}.html").write_text(result.stdout)
    # A console line: [..:INFO:CONSOLE:62] "Uncaught SyntaxError: ...", source: URL (62)
    errors = [line.split("CONSOLE", 1)[1] for line in result.stderr.splitlines()
              if ":CONSOLE" in line and re.search(r'"(Uncaught|Failed to load)', line)]
    page = Rendered(result.stdout, errors, ARTIFACTS / f"{name}.png")
    body = page.soup.body
    assert body is not None and body.get("data-probed") == "yes", \
        f"{url}: the page did not finish loading in Chromium"
    height = min(int(body["data-page-height"]), MAX_SHOT_HEIGHT)
    subprocess.run([*common, f"--window-size={WIDTH},{height}", f"--screenshot={page.screenshot}",
                    url], capture_output=True, timeout=180, check=True)
    return page
