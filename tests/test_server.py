"""``minillm serve`` against the official ``openai`` client, on 127.0.0.1: streamed text
equals the non-streamed text and plain greedy decoding, stop strings that span tokens
never leak, usage adds up, ``n`` samples come indexed, 16 concurrent streams each get
what they get alone, a client that hangs up frees its blocks, and every bad request gets
OpenAI's error body while the server keeps serving."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import httpx
import openai
import pytest

from minillm import Tokenizer
from minillm.parallel.launch import free_port
from minillm.reference import generate  # the oracle: the course's dense loop
from minillm.serve import LLM, SchedulerConfig
from minillm.serve.detokenizer import IncrementalDetokenizer, held_back
from minillm.serve.server import serve_in_background

pytestmark = pytest.mark.smollm2
BLOCKS = 256
ARTIFACTS = Path(__file__).resolve().parents[1] / "book" / "_build" / "browser"  # screenshots


@pytest.fixture(scope="module")
def server():
    llm = LLM("smollm2", num_blocks=BLOCKS, scheduler=SchedulerConfig(max_batch=16))
    with serve_in_background(llm) as url:
        yield SimpleNamespace(url=url, llm=llm, client=openai.OpenAI(
            base_url=url + "/v1", api_key="-", max_retries=0))


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer("smollm2")


def greedy_text(model, tokenizer, prompt_ids, max_tokens):
    tokens = generate(model, prompt_ids, max_tokens, stop_tokens=tokenizer.stop_tokens)[0]
    return tokenizer.decode(tokens), tokens


def stream_completion(client, **request):
    chunks = list(client.completions.create(stream=True, **request))
    return chunks, "".join(c.choices[0].text for c in chunks if c.choices)


def test_completions_streamed_and_not_equal_plain_greedy_decoding(server, smollm2, tokenizer):
    request = dict(model="smollm2", prompt="The three primary colors are", max_tokens=16,
                   temperature=0)
    whole = server.client.completions.create(**request)
    chunks, streamed = stream_completion(server.client, **request)
    expected, tokens = greedy_text(smollm2, tokenizer, tokenizer.encode(request["prompt"]), 16)
    assert whole.choices[0].text == streamed == expected
    assert [c.choices[0].finish_reason for c in chunks].count("length") == 1
    assert chunks[-1].choices[0].finish_reason == "length"
    prompt_tokens = len(tokenizer.encode(request["prompt"]))
    assert whole.usage.prompt_tokens == prompt_tokens
    assert whole.usage.completion_tokens == len(tokens) == 16
    assert whole.usage.total_tokens == prompt_tokens + 16


def test_chat_streamed_and_not_agree_and_end_once(server, smollm2, tokenizer):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    whole = server.client.chat.completions.create(model="smollm2", messages=messages,
                                                  max_tokens=24, temperature=0)
    chunks = list(server.client.chat.completions.create(
        model="smollm2", messages=messages, max_tokens=24, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    expected, tokens = greedy_text(smollm2, tokenizer,
                                   tokenizer.conversation_prompt(messages), 24)
    assert whole.choices[0].message.content == text == expected
    assert whole.choices[0].message.role == "assistant"
    assert chunks[0].choices[0].delta.role == "assistant"
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert len([r for r in reasons if r]) == 1 and reasons[-1] == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(tokens)
    assert all(c.usage is None for c in chunks[:-1])
    assert chunks[-1].usage.total_tokens == chunks[-1].usage.prompt_tokens + len(tokens)


def test_a_stop_string_across_tokens_ends_the_reply_before_it(server, smollm2, tokenizer):
    prompt = "List three fruits: apples, bananas"
    text, tokens = greedy_text(smollm2, tokenizer, tokenizer.encode(prompt), 24)
    boundary = len(tokenizer.decode(tokens[:6]))  # a stop string straddling tokens 6 and 7
    stop = text[boundary - 2:boundary + 2]
    expected = text[:text.find(stop)]
    request = dict(model="smollm2", prompt=prompt, max_tokens=24, temperature=0, stop=[stop])
    whole = server.client.completions.create(**request)
    chunks, streamed = stream_completion(server.client, **request)
    assert whole.choices[0].text == streamed == expected
    assert stop not in streamed and whole.choices[0].finish_reason == "stop"
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_n_samples_come_indexed(server):
    whole = server.client.completions.create(model="smollm2", prompt="Once upon a time",
                                             max_tokens=8, temperature=0.8, seed=3, n=3)
    assert sorted(c.index for c in whole.choices) == [0, 1, 2]
    assert all(c.finish_reason in ("stop", "length") for c in whole.choices)
    chunks, _ = stream_completion(server.client, model="smollm2", prompt="Once upon a time",
                                  max_tokens=8, temperature=0.8, seed=3, n=3)
    for index in range(3):
        streamed = "".join(c.choices[0].text for c in chunks if c.choices[0].index == index)
        assert streamed == whole.choices[index].text  # seeded: the same samples


def test_sixteen_concurrent_streams_each_get_their_text_alone(server, smollm2, tokenizer):
    prompts = [f"Question {i}: what is {i} plus {i}? Answer:" for i in range(16)]
    with ThreadPoolExecutor(16) as pool:
        streamed = list(pool.map(lambda p: stream_completion(
            server.client, model="smollm2", prompt=p, max_tokens=8, temperature=0)[1], prompts))
    for prompt, text in zip(prompts, streamed, strict=True):
        assert text == greedy_text(smollm2, tokenizer, tokenizer.encode(prompt), 8)[0]


def test_a_client_that_hangs_up_frees_its_blocks(server):
    body = {"model": "smollm2", "max_tokens": 400, "temperature": 0, "stream": True,
            "messages": [{"role": "user", "content": "Write a long story about a dragon."}]}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body,
                      timeout=60) as reply:
        text_chunks = (line for line in reply.iter_lines()
                       if line.startswith("data: {") and '"role"' not in line)
        next(text_chunks)  # text, not the role chunk that is sent before the first step
        assert server.llm.free_blocks() < BLOCKS  # it is running
    deadline = time.monotonic() + 10
    while server.llm.free_blocks() != BLOCKS and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.llm.free_blocks() == BLOCKS and not server.llm.has_work


@pytest.mark.parametrize("body, status, param", [
    ('{"model": "smollm2", "prompt": ', 400, None),  # not JSON
    ({"model": "smollm2", "prompt": "Hi", "temperature": "hot"}, 400, "temperature"),
    ({"model": "smollm2", "prompt": "Hi", "max_tokens": 0}, 400, "max_tokens"),
    ({"model": "smollm2", "prompt": "Hi", "n": 5}, 400, "n"),
    ({"model": "smollm2", "prompt": "Hi", "top_p": 0}, 400, "top_p"),
    ({"model": "smollm2", "prompt": "Hi", "stream_options": {"include_usage": True}}, 400, None),
    ({"model": "smollm2", "prompt": "Hi " * 9000}, 400, "prompt"),
    ({"model": "gpt-9", "prompt": "Hi"}, 404, "model"),
    ({"model": "smollm2", "messages": []}, 400, "messages"),
    ({"model": "smollm2", "prompt": "Hi", "logprobs": 6}, 400, "logprobs"),
    ({"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}], "logprobs": True,
      "top_logprobs": 21}, 400, "top_logprobs"),
    ({"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}],
      "top_logprobs": 2}, 400, None),
])
def test_bad_requests_get_openai_errors_and_the_server_goes_on(server, body, status, param):
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    content = body if isinstance(body, str) else None
    reply = httpx.post(server.url + path, content=content, timeout=60,
                       json=None if content else body,
                       headers={"Content-Type": "application/json"})
    assert reply.status_code == status
    error = reply.json()["error"]
    assert error["message"] and error["type"] == "invalid_request_error"
    assert error["param"] == param
    ok = server.client.completions.create(model="smollm2", prompt="Hi", max_tokens=2)
    assert ok.choices[0].finish_reason in ("stop", "length")


def test_logprobs_are_the_model_log_softmax_of_each_token(server, smollm2, tokenizer):
    import torch

    prompt = "The capital of France is"
    whole = server.client.completions.create(model="smollm2", prompt=prompt, max_tokens=6,
                                             temperature=0, logprobs=3)
    chunks, _ = stream_completion(server.client, model="smollm2", prompt=prompt, max_tokens=6,
                                  temperature=0, logprobs=3)
    lp = whole.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == whole.usage.completion_tokens == 6
    assert [len(top) for top in lp.top_logprobs] == [3] * 6
    streamed = [x for c in chunks if c.choices[0].logprobs
                for x in c.choices[0].logprobs.token_logprobs]
    assert streamed == pytest.approx(lp.token_logprobs)
    ids = tokenizer.encode(prompt)
    tokens = generate(smollm2, ids, 6)[0]
    with torch.no_grad():
        reference = torch.log_softmax(smollm2(torch.tensor([ids + tokens]))[0], -1)
    for i, token in enumerate(tokens):
        expected = float(reference[len(ids) - 1 + i, token])
        assert lp.token_logprobs[i] == pytest.approx(expected, abs=1e-3)
        assert max(lp.top_logprobs[i].values()) == pytest.approx(lp.token_logprobs[i])  # greedy
    chat = server.client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
        temperature=0, logprobs=True, top_logprobs=5)
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens
    assert all(len(entry.top_logprobs) == 5 and entry.logprob <= 0 for entry in content)


def test_health_models_and_metrics(server):
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    assert [m.id for m in server.client.models.list()] == ["smollm2"]
    text = httpx.get(server.url + "/metrics").text
    for name in ("minillm_requests_total", "minillm_generation_tokens_total",
                 "minillm_time_to_first_token_seconds_bucket", "minillm_kv_blocks_used",
                 "minillm_requests_waiting"):
        assert name in text


def test_the_detokenizer_holds_back_partial_characters_and_stop_prefixes(tokenizer):
    emoji = tokenizer.encode("I like 🍕 a lot")
    detokenizer = IncrementalDetokenizer(tokenizer)
    pieces = [detokenizer.push([token]) for token in emoji]
    assert "\ufffd" not in "".join(pieces) and "".join(pieces) == "I like 🍕 a lot"
    assert held_back("the end of the", ["the end.", "zzz"]) == len("the")
    stopping = IncrementalDetokenizer(tokenizer, ["lot"])
    assert "".join(stopping.push([t]) for t in emoji) == "I like 🍕 a "
    assert stopping.stopped and stopping.finish() == ""


def test_minillm_serve_from_the_command_line():
    import subprocess
    import sys

    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "minillm", "serve", "--port", str(port),
                                "--num-blocks", "64"])
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and process.poll() is None:
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        client = openai.OpenAI(base_url=url + "/v1", api_key="-", max_retries=0)
        reply = client.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "Say hi."}], max_tokens=4)
        assert reply.choices[0].message.content and reply.usage.completion_tokens <= 4
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_the_chat_page_streams_a_reply_in_chromium(server):
    from devtools import Chromium

    browser = Chromium()
    try:
        browser.open(server.url + "/")
        browser.wait_for("document.getElementById('model').textContent === 'smollm2'", 30)
        browser.evaluate("document.getElementById('max-tokens').value = 24")
        browser.evaluate("document.getElementById('temperature').value = 0")  # greedy
        browser.evaluate("document.getElementById('message').focus()")
        browser.type("What is the capital of France?")
        browser.evaluate("document.getElementById('send').click()")
        browser.wait_for("document.querySelector('.assistant')?.dataset.done === 'yes'", 120)
        reply = browser.evaluate("document.querySelector('.assistant').textContent")
        stats = browser.evaluate("document.getElementById('stats').textContent")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        (ARTIFACTS / "chat.png").write_bytes(browser.screenshot())
    finally:
        browser.close()
    greedy = server.client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "What is the capital of France?"}],
        temperature=0, max_tokens=24).choices[0].message.content
    assert reply.strip() == greedy.strip() and "TTFT" in stats and "tokens/s" in stats
