"""Fixtures of the website checks (the helpers live in book_site.py).

Every test that takes a `page` argument runs once per page of the table of contents
(`intro`, `install`, ..., `notebooks/09_sparsity`), so a new chapter is checked as soon as
it is listed in book/_toc.yml.
"""

from __future__ import annotations

import functools
import http.server
import threading

import pytest
from book_site import SITE, ProbingHandler, toc_pages


def pytest_generate_tests(metafunc):
    if "page" in metafunc.fixturenames:
        metafunc.parametrize("page", toc_pages())


@pytest.fixture(scope="session")
def site_url():
    """The built site served on 127.0.0.1 (with the measuring script added to each page)."""
    if not (SITE / "index.html").exists():
        raise RuntimeError(f"{SITE} has no index.html: build the book first (make book)")
    handler = functools.partial(ProbingHandler, directory=str(SITE))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
