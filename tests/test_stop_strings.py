"""Stop strings, made in one place: the output processor ends a reply before its first stop
string (or after it, with ``include_stop_str_in_output``), however the tokens arrive and
whatever they spell, and ``LLM.generate``, ``LLM.stream``, ``generate()`` and the server
give the same text for the same request.

The reference is plain string work on decoded prefixes: the reply ends at the first token
whose text contains a stop string (the stream stops as soon as one appears), before the
earliest stop string in that text."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minillm.checkpoint import resolve_checkpoint, save_model
from minillm.config import ModelConfig
from minillm.engine.deltas import RequestDelta
from minillm.generate import generate
from minillm.quant.checkpoint import copy_tokenizer_files
from minillm.sampling import SamplingParams
from minillm.serve import LLM
from minillm.serve.detokenizer import IncrementalDetokenizer
from minillm.serve.output_processor import OutputProcessor
from minillm.serve.sample_stream import SampleStream
from minillm.serve.server import serve_in_background
from minillm.testing import TINY, varied_random_model

TEXTS = ["I love 🦙 llamas, and 日本語 too.\n\nThe end. Ünïcödé ∑ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢!",
         "def f(x):\n    return x  # done\n\n\nprint(f(2))\n",
         "aaaa bbbb aaaa bbbb. Stop here: STOP, or later STOP."]


def expected(tokenizer, tokens: list[int], stops: list[str], include: bool
             ) -> tuple[str, list[int], str | None]:
    """The reply's text and tokens, and the stop string that ended it (None: no stop)."""
    for kept in range(1, len(tokens) + 1):
        text = tokenizer.decode(tokens[:kept])
        if found := [(text.find(stop), stop) for stop in stops if stop in text]:
            at, stop = min(found)
            return text[:at] + (stop if include else ""), tokens[:kept], stop
    return tokenizer.decode(tokens), tokens, None


def run_processor(tokenizer, tokens: list[int], chunks: list[int], params: SamplingParams
                  ) -> tuple[str, str, list[int], str | None]:
    """(The text of the updates, the output's text, its tokens, its stop reason) when the
    tokens arrive in deltas of the given sizes."""
    processor = OutputProcessor(tokenizer)
    output = processor.add(0, [1], params)
    streamed, start = "", 0
    for size in chunks:
        piece = tuple(tokens[start:start + size])
        start += size
        last = start >= len(tokens)
        for update in processor.process([RequestDelta(0, 0, piece,
                                                      finish_reason="length" if last else None)]):
            streamed += update.text
        if output.finished:
            break
    return streamed, output.text, output.tokens, output.outputs[0].stop_reason


@st.composite
def streams(draw, tokenizer):
    """A token stream (real text, or any token ids), the sizes of the deltas it arrives in,
    and stop strings: pieces of its text that span tokens and characters, or strings it
    does not contain."""
    if draw(st.booleans()):
        tokens = tokenizer.encode(draw(st.sampled_from(TEXTS)))
    else:
        tokens = draw(st.lists(st.integers(0, tokenizer.vocab_size - 1), min_size=1,
                               max_size=30))
    text = tokenizer.decode(tokens).replace("\ufffd", "")
    stops = []
    for _ in range(draw(st.integers(1, 3))):
        if text and draw(st.integers(0, 3)):
            start = draw(st.integers(0, len(text) - 1))
            stops.append(text[start:start + draw(st.integers(1, 6))])
        else:
            stops.append(draw(st.text(min_size=1, max_size=4).filter(lambda s: "\ufffd" not in s)))
    chunks, left = [], len(tokens)
    while left > 0:
        chunks.append(min(left, draw(st.integers(1, 4))))  # speculation: several at once
        left -= chunks[-1]
    return tokens, chunks, stops, draw(st.booleans())


@settings(max_examples=300, deadline=None, derandomize=True)
@given(data=st.data())
def test_the_processor_stops_where_the_text_does_however_the_tokens_arrive(tokenizer, data):
    tokens, chunks, stops, include = data.draw(streams(tokenizer))
    params = SamplingParams(stop=stops, include_stop_str_in_output=include)
    streamed, text, kept, reason = run_processor(tokenizer, tokens, chunks, params)
    want_text, want_tokens, want_stop = expected(tokenizer, tokens, stops, include)
    assert (streamed, text, kept, reason) == (want_text, want_text, want_tokens, want_stop)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(data=st.data())
def test_the_incremental_text_is_the_whole_outputs_text(tokenizer, data):
    """The detokenizer decodes a short window per token, never the whole output again: its
    text must still be what decoding the whole output gives, after every token."""
    tokens, chunks, _, _ = data.draw(streams(tokenizer))
    detokenizer, start = IncrementalDetokenizer(tokenizer), 0
    for size in chunks:
        detokenizer.push(tokens[start:start + size])
        start += size
        assert detokenizer.text() == tokenizer.decode(tokens[:start])


def test_a_stop_string_split_across_tokens_and_inside_a_character(tokenizer):
    """Each token of a llama emoji is a few of its four bytes: the stop ends the text before
    the whole character, and not at the first of its tokens."""
    tokens = tokenizer.encode("so 🦙 said")
    emoji = tokenizer.encode("🦙")
    assert len(emoji) > 1
    for include in (False, True):
        params = SamplingParams(stop=["🦙 s"], include_stop_str_in_output=include)
        streamed, text, kept, reason = run_processor(tokenizer, tokens, [1] * len(tokens),
                                                     params)
        assert text == streamed == ("so 🦙 s" if include else "so ")
        assert reason == "🦙 s" and tokenizer.decode(kept).startswith("so 🦙 s")


# -- every client gives the same text ---------------------------------------------------------

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random model with SmolLM2's vocabulary and tokenizer (random text: multi-byte
    characters, odd spacing), saved so a server can load it."""
    directory = tmp_path_factory.mktemp("tiny-stops")
    model = varied_random_model(ModelConfig(**{**TINY, "vocab_size": 49152,
                                               "max_position_embeddings": 256}))
    save_model(model, directory)
    copy_tokenizer_files(resolve_checkpoint("smollm2"), directory)
    return str(directory), model


PROMPTS = [[5, 17, 99, 3, 42, 7, 8], [1000, 2000, 3000], [41, 42, 43, 44, 45, 46]]


def cases(llm: LLM, tokenizer) -> list[tuple[list[int], list[str], bool]]:
    """Stop strings cut from each prompt's own greedy reply, spanning its tokens."""
    replies = llm.generate(PROMPTS, SamplingParams(max_tokens=24), progress=False)
    chosen = []
    for prompt, reply in zip(PROMPTS, replies, strict=True):
        text = reply.text.replace("\ufffd", "")
        middle = len(text) // 2
        chosen.append((prompt, [text[middle:middle + 3]], False))
        chosen.append((prompt, [text[middle + 1:middle + 2], "never in it"], True))
    return chosen


def server_texts(url: str, prompt: list[int], params: dict) -> tuple[str, str]:
    """(The whole reply's text, the streamed reply's text) from the HTTP server."""
    body = {"model": "tiny", "prompt": prompt, "temperature": 0, **params}
    whole = httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()
    streamed = ""
    with httpx.stream("POST", f"{url}/v1/completions", json={**body, "stream": True},
                      timeout=60) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                streamed += json.loads(line[6:])["choices"][0]["text"]
    return whole["choices"][0]["text"], streamed


def test_every_client_gives_the_same_text(tiny, tokenizer):
    directory, model = tiny
    llm = LLM(directory, block_size=4, num_blocks=128)
    with serve_in_background(LLM(directory, block_size=4, num_blocks=128), "tiny") as url:
        for prompt, stops, include in cases(llm, tokenizer):
            params = SamplingParams(max_tokens=24, stop=stops, include_stop_str_in_output=include)
            [offline] = llm.generate([prompt], params, progress=False)
            streamed = "".join(update.text for update in llm.stream(prompt, params))
            [tokens] = generate(model, prompt, 24, params, tokenizer=llm.tokenizer,
                                stop_tokens=llm.tokenizer.stop_tokens)
            over_http = server_texts(url, prompt, {"max_tokens": 24, "stop": stops,
                                                  "include_stop_str_in_output": include})
            assert offline.text == streamed == over_http[0] == over_http[1], (stops, include)
            assert tokens == offline.tokens
            assert offline.outputs[0].stop_reason in stops  # cut from its own reply: it stops
            assert llm.free_blocks() == 128


def test_every_client_runs_the_engines_sample_streams(tiny):
    """``LLM(sample_stream=...)`` (chapter 15's lab seam) makes the stream of every sample:
    ``generate``'s (one per sample of ``n``), ``stream``'s and the server's."""
    made = []

    def counting(tokenizer, params):
        made.append(params)
        return SampleStream(tokenizer, params)

    llm = LLM(tiny[0], block_size=4, num_blocks=64, sample_stream=counting)
    llm.generate([PROMPTS[0]], SamplingParams(max_tokens=4, n=2), progress=False)
    assert len(made) == 2
    list(llm.stream(PROMPTS[1], SamplingParams(max_tokens=4)))
    assert len(made) == 3
    with serve_in_background(llm, "tiny") as url:
        server_texts(url, PROMPTS[2], {"max_tokens": 4})  # a whole reply, then a streamed one
    assert len(made) == 5
