"""The built course website, opened in a real browser (headless Chromium).

Run after `make book`. Checks that the home page and a chapter page render: the title,
a figure, a code cell's output; and saves screenshots and DOM dumps for people to look at
(book/_build/browser/).
"""

from __future__ import annotations

import functools
import http.server
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SITE = REPO / "book" / "_build" / "html"
ARTIFACTS = REPO / "book" / "_build" / "browser"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--hide-scrollbars"]


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    raise RuntimeError("no Chromium found: install it (Debian: apt-get install chromium)")


@pytest.fixture(scope="module")
def site_url():
    if not (SITE / "index.html").exists():
        raise RuntimeError(f"{SITE} has no index.html: build the book first (make book)")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(SITE))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def render(url: str, name: str, tmp_path: Path) -> str:
    """The page's DOM after scripts ran; also writes a screenshot and the DOM to ARTIFACTS."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    profile = ["--user-data-dir=" + str(tmp_path / "profile")]
    dom = subprocess.run([chromium(), *CHROMIUM_FLAGS, *profile, "--dump-dom", url],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    (ARTIFACTS / f"{name}.html").write_text(dom)
    shot = ARTIFACTS / f"{name}.png"
    subprocess.run([chromium(), *CHROMIUM_FLAGS, *profile, f"--screenshot={shot}",
                    "--window-size=1280,1600", url], capture_output=True, timeout=120, check=True)
    assert shot.stat().st_size > 20_000, "screenshot is (nearly) blank"
    return dom


def test_home_page_renders(site_url, tmp_path):
    dom = render(f"{site_url}/intro.html", "home", tmp_path)
    assert "LLM inference from the ground up" in dom
    assert "Anatomy of inference" in dom  # the table of contents lists the chapters
    assert "Exercises and grading" in dom


def test_chapter_page_shows_figures_and_outputs(site_url, tmp_path):
    dom = render(f"{site_url}/notebooks/03_kv_cache.html", "chapter03", tmp_path)
    assert "<h1" in dom and "KV cache" in dom
    assert "<img" in dom and ("image/png" in dom or "_images/" in dom)  # a stored figure
    assert "cell_output" in dom  # a code cell's stored output is shown
    assert "mjx-container" in dom  # equations rendered by MathJax (served with the site)
