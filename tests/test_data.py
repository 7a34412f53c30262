"""The text corpora: wiki markup cleaning, fetching, and fixed train/eval splits.

The corpora go to the real cache (``$MINILLM_HOME`` or ``~/.cache/minillm``), so they are
fetched once per machine; on a fresh machine the first test downloads them (a few seconds).
"""

from __future__ import annotations

import pytest

from minillm import data

MARKUP = """{{Infobox person|name=Ada Lovelace|birth_date=1815}}
'''Ada Lovelace''' was an English [[mathematician]] and [[writer|author]].<ref>{{cite book
|title=Ada}}</ref> She worked on the [[Analytical Engine]].<ref name="b" />
[[File:Ada Lovelace portrait.jpg|thumb|left|A portrait of [[Ada Lovelace]].]]

== Early life ==
She was the only child of ''Lord Byron''.

{| class="wikitable"
|-
! Year !! Event
|-
| 1815 || Born
|}

== References ==
{{Reflist}}
* A book about her.

[[Category:English mathematicians]]
[[fr:Ada Lovelace]]
"""

# Words a document of each corpus's eval split is sure to hold.
EXPECTED_WORDS = {
    "wikipedia": ["the", "which", "century"],
    "sotu": ["Congress", "the United States", "government"],
    "shakespeare": ["thou", "lord", "ACT I", "SCENE"],
}


def test_clean_wikitext_keeps_prose_and_drops_markup():
    text = data.clean_wikitext(MARKUP)
    assert text.startswith("Ada Lovelace was an English mathematician and author.")
    assert "She worked on the Analytical Engine." in text
    assert "Early life\nShe was the only child of Lord Byron." in text
    for gone in ("[[", "]]", "{{", "}}", "'''", "cite", "Infobox", "thumb", "portrait",
                 "Category", "fr:", "wikitable", "1815", "References", "A book about her"):
        assert gone not in text, gone


@pytest.mark.parametrize("name", data.CORPORA)
def test_fetch_once_then_from_cache(name):
    path = data.fetch_corpus(name)
    assert path.exists() and path.parent.name == "corpora"
    assert data.fetch_corpus(name) == path


@pytest.mark.parametrize("name", data.CORPORA)
def test_splits_are_fixed_disjoint_and_cover_the_corpus(name):
    train = data.load_documents(name, "train")
    evals = data.load_documents(name, "eval")
    everything = data.load_documents(name, "all")
    assert train and evals
    assert not set(train) & set(evals)
    assert everything[9::10] == evals
    assert len(train) + len(evals) == len(everything)
    assert 0.05 <= len(evals) / len(everything) <= 0.15
    assert data.load_documents(name, "eval") == evals  # the same split every time
    assert data.load_text(name) == "\n\n".join(evals)


@pytest.mark.parametrize(("name", "documents"), [("sotu", 249), ("shakespeare", 38)])
def test_document_counts(name, documents):
    assert len(data.load_documents(name, "all")) == documents


def test_wikipedia_is_plain_english_prose():
    articles = data.load_documents("wikipedia", "all")
    assert len(articles) > 100
    assert articles[0].startswith("Anarchism\n\nAnarchism is a political philosophy")
    text = data.load_text("wikipedia", "eval")
    assert len(text) > 100_000
    for markup in ("[[", "]]", "{{", "}}", "<ref", "thumb|", "Category:", "'''", "\n\n\n"):
        assert markup not in text, markup


def test_markdown_and_transcript_notes_are_gone():
    plays = data.load_text("shakespeare", "all")
    speeches = data.load_text("sotu", "all")
    for mark in ("**", "_", "#", "\\["):
        assert mark not in plays, mark
    for note in ("[Applause]", "[Laughter]", "[see APP Note]"):
        assert note not in speeches, note


@pytest.mark.parametrize("name", data.CORPORA)
def test_eval_text_has_expected_words(name):
    text = data.load_text(name, "eval")
    for word in EXPECTED_WORDS[name]:
        assert word in text, word


@pytest.mark.parametrize("call", [
    lambda: data.fetch_corpus("wikitext"),
    lambda: data.load_documents("Wikipedia"),
    lambda: data.load_text("sotu", "test"),
    lambda: data.load_documents("shakespeare", "validation"),
])
def test_bad_names_raise_value_error(call):
    with pytest.raises(ValueError, match="choose one of"):
        call()
