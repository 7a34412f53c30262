"""Every OpenAI request field is honoured or refused, never ignored: the official ``openai``
client against ``minillm serve``. Each field this server cannot honour, and any unknown
field, gets a 400 that names it; the sampling fields reach the engine's SamplingParams;
``logit_bias`` moves the greedy choice; ``best_of`` returns the most likely samples; ``echo``
and the four prompt shapes of /v1/completions follow OpenAI's rules; and the output
constraints (``response_format``, vLLM's ``guided_*``) hold. A tiny random model with
SmolLM2's vocabulary serves where the text's meaning does not matter; SmolLM2 where it does
(a JSON reply that must end within max_tokens)."""

from __future__ import annotations

import json
import re
import time
from types import SimpleNamespace

import httpx
import openai
import pytest
import torch
from openai.types import completion_create_params
from openai.types.chat import ChatCompletionStreamOptionsParam
from openai.types.chat import completion_create_params as chat_completion_create_params
from pydantic import BaseModel

from minillm.checkpoint import resolve_checkpoint, save_model
from minillm.config import ModelConfig
from minillm.quant.checkpoint import copy_tokenizer_files
from minillm.sampling import SamplingParams
from minillm.serve import LLM, SchedulerConfig
from minillm.serve.server import (
    UNSUPPORTED,
    ChatRequest,
    CompletionRequest,
    StreamOptions,
    serve_in_background,
)
from minillm.structured.spec import Choice, JsonObject, JsonSchema, Regex
from minillm.testing import TINY, varied_random_model

BLOCKS = 256
CHAT = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, tokenizer):
    """A tiny random model with SmolLM2's vocabulary behind a server whose engine keeps
    every request it is given (``submitted``: its parameters and its output)."""
    directory = tmp_path_factory.mktemp("tiny")
    model = varied_random_model(ModelConfig(**{**TINY, "vocab_size": 49152,
                                               "max_position_embeddings": 256}))
    save_model(model, directory)
    copy_tokenizer_files(resolve_checkpoint("smollm2"), directory)
    llm = LLM(str(directory), block_size=4, num_blocks=BLOCKS,
              scheduler=SchedulerConfig(max_batch=16))
    submitted = []
    admit = llm.admit

    def recording(prompt, params, processor):
        submitted.append((params, admit(prompt, params, processor)))
        return submitted[-1][1]

    llm.admit = recording
    with serve_in_background(llm, "tiny") as url:
        yield SimpleNamespace(url=url, llm=llm, model=model, submitted=submitted,
                              client=openai.OpenAI(base_url=url + "/v1", api_key="-",
                                                   max_retries=0))


@pytest.fixture(scope="module")
def smollm2_server():
    llm = LLM("smollm2", num_blocks=BLOCKS, scheduler=SchedulerConfig(max_batch=8))
    with serve_in_background(llm) as url:
        yield openai.OpenAI(base_url=url + "/v1", api_key="-", max_retries=0)


def post(server, body: dict) -> httpx.Response:
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    return httpx.post(server.url + path, json={"model": "tiny", **body}, timeout=60)


def assert_refused(reply: httpx.Response, param: str, *words: str) -> None:
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert all(word in error["message"] for word in words), error["message"]


def greedy_tokens(model, prompt: list[int], steps: int, bias: dict[int, float]) -> list[int]:
    """The tiny model's greedy tokens after ``prompt`` with ``bias`` added to its logits."""
    tokens = list(prompt)
    for _ in range(steps):
        with torch.no_grad():
            logits = model(torch.tensor([tokens]))[0, -1]
        for token, value in bias.items():
            logits[token] += value
        tokens.append(int(logits.argmax()))
    return tokens[len(prompt):]


# OpenAI's fields this server cannot honour, each with a value that asks for it
REFUSED = {
    "suffix": "the end.", "tools": [{"type": "function", "function": {"name": "f"}}],
    "tool_choice": "auto", "parallel_tool_calls": True, "functions": [{"name": "f"}],
    "function_call": "auto", "audio": {"voice": "alloy", "format": "mp3"},
    "modalities": ["text", "audio"], "prediction": {"type": "content", "content": "Hi"},
    "reasoning_effort": "low", "verbosity": "low", "web_search_options": {},
    "service_tier": "flex", "store": True, "metadata": {"user": "me"},
    "moderation": {"model": "omni-moderation-latest"}, "prompt_cache_key": "k",
    "prompt_cache_retention": "24h", "prompt_cache_options": {"mode": "explicit"},
}


@pytest.mark.parametrize("params, request_model", [
    (completion_create_params.CompletionCreateParamsStreaming, CompletionRequest),
    (chat_completion_create_params.CompletionCreateParamsStreaming, ChatRequest),
    (ChatCompletionStreamOptionsParam, StreamOptions)])
def test_every_field_of_the_openai_client_is_honoured_or_refused(params, request_model):
    """The installed ``openai`` package's request fields, each one a field of the server's
    request model or one it refuses; and each refused one is tested below."""
    fields = {info.alias or name for name, info in request_model.model_fields.items()}
    openai_fields = params.__required_keys__ | params.__optional_keys__
    assert openai_fields - fields <= set(UNSUPPORTED)
    assert set(REFUSED) == set(UNSUPPORTED) - {"include_obfuscation"}  # stream_options's


@pytest.mark.parametrize("name", REFUSED)
def test_each_unsupported_openai_field_is_refused_by_name(tiny, name):
    body = {"prompt": "Hi"} if name == "suffix" else {"messages": CHAT}
    assert_refused(post(tiny, {**body, name: REFUSED[name]}), name, "not supported",
                   "remove it")


def test_unsupported_fields_that_ask_for_nothing_are_accepted(tiny):
    nothing = {"tools": None, "store": False, "parallel_tool_calls": False, "metadata": None,
               "stream": True, "stream_options": {"include_obfuscation": False}}
    assert post(tiny, {"messages": CHAT, "max_tokens": 2, **nothing}).status_code == 200
    assert_refused(post(tiny, {"messages": CHAT, "stream": True,
                               "stream_options": {"include_obfuscation": True}}),
                   "stream_options.include_obfuscation", "not supported")


@pytest.mark.parametrize("body", [{"prompt": "Hi"}, {"messages": CHAT}])
def test_an_unknown_field_is_refused_by_name(tiny, body):
    assert_refused(post(tiny, {**body, "temprature": 0}), "temprature", "does not know")
    if "messages" in body:
        named = [{"role": "user", "content": "Hi", "name": "ann"}]
        assert_refused(post(tiny, {"messages": named}), "messages.0.name", "does not know")


BAD = {
    "logit_bias id past the vocabulary": ({"logit_bias": {"49152": 5}}, "logit_bias"),
    "logit_bias negative id": ({"logit_bias": {"-1": 5}}, "logit_bias"),
    "logit_bias over 100": ({"logit_bias": {"5": 100.5}}, "logit_bias"),
    "logit_bias under -100": ({"logit_bias": {"5": -101}}, "logit_bias"),
    "logit_bias key not an id": ({"logit_bias": {"five": 1}}, "logit_bias"),
    "logit_bias key not whole": ({"logit_bias": {"5.5": 1}}, "logit_bias"),
    "presence_penalty over 2": ({"presence_penalty": 2.5}, "presence_penalty"),
    "frequency_penalty under -2": ({"frequency_penalty": -3}, "frequency_penalty"),
    "min_p over 1": ({"min_p": 1.5}, "min_p"),
    "top_k under -1": ({"top_k": -2}, "top_k"),
    "best_of under n": ({"n": 3, "best_of": 2}, "best_of"),
    "best_of over n streamed": ({"n": 1, "best_of": 2, "stream": True}, "best_of"),
    "best_of over the limit": ({"best_of": 5}, "best_of"),
    "echo with logprobs": ({"echo": True, "logprobs": 1}, "echo"),
    "an empty prompt list": ({"prompt": []}, "prompt"),
    "an invalid regex": ({"guided_regex": "[0-9"}, "guided_regex"),
    "an empty choice": ({"guided_choice": []}, "guided_choice"),
    "guided_json not JSON": ({"guided_json": "{'type': 'object'"}, "guided_json"),
    "guided_json an invalid schema": ({"guided_json": {"type": "tuple"}}, "guided_json"),
    "an invalid response_format schema": ({"response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"minLength": -1}}}},
        "response_format"),
    "two constraints": ({"response_format": {"type": "json_object"},
                         "guided_choice": ["a"]}, "guided_choice"),
    "two token limits": ({"messages": CHAT, "max_tokens": 3, "max_completion_tokens": 4},
                         "max_completion_tokens"),
}


@pytest.mark.parametrize("change, param", BAD.values(), ids=BAD.keys())
def test_bad_values_are_400s_that_name_the_field(tiny, change, param):
    body = {"prompt": [5, 6], "max_tokens": 2} if "messages" not in change else {}
    assert_refused(post(tiny, {**body, **change}), param)


def test_a_refused_prompt_cancels_the_other_prompts_of_its_request(tiny):
    before = len(tiny.submitted)
    assert_refused(post(tiny, {"prompt": [[5, 6], [7, 49152]], "max_tokens": 200}), "prompt",
                   "outside the vocabulary")
    (_, first), (_, second) = tiny.submitted[before:]
    deadline = time.monotonic() + 10
    while not first.finished and time.monotonic() < deadline:
        time.sleep(0.05)
    assert first.finish_reason == "abort" and len(first.tokens) < 200
    assert second.finish_reason == "error"
    assert tiny.llm.free_blocks() == BLOCKS


def test_every_honoured_field_reaches_the_engine(tiny):
    tiny.client.chat.completions.create(
        model="tiny", messages=CHAT, max_completion_tokens=3, temperature=0.7, top_p=0.9,
        n=2, seed=5, stop=["zzz"], logprobs=True, top_logprobs=2, presence_penalty=0.5,
        frequency_penalty=-0.5, logit_bias={"17": 3, "5": -2}, user="ann",
        safety_identifier="ann-hash", response_format={"type": "json_object"},
        extra_body={"top_k": -1, "min_p": 0.05, "repetition_penalty": 1.1})
    assert tiny.submitted[-1][0] == SamplingParams(
        max_tokens=3, temperature=0.7, top_p=0.9, n=2, seed=5, logprobs=2,
        presence_penalty=0.5, frequency_penalty=-0.5, logit_bias={5: -2.0, 17: 3.0}, top_k=0,
        min_p=0.05, repetition_penalty=1.1, structured=JsonObject(), stop=("zzz",))
    constraints = {"guided_regex": ("[a-z]+", Regex("[a-z]+")),
                   "guided_choice": (["a", "b"], Choice(("a", "b"))),
                   "guided_json": ('{"type": "string"}', JsonSchema.of({"type": "string"})),
                   "response_format": ({"type": "json_schema", "json_schema": {
                       "name": "s", "schema": {"type": "string"}, "strict": True}},
                                       JsonSchema.of({"type": "string"}))}
    for name, (value, spec) in constraints.items():
        tiny.client.completions.create(model="tiny", prompt=[5], max_tokens=2,
                                       extra_body={name: value, "top_k": 7})
        params = tiny.submitted[-1][0]
        assert params.structured == spec and params.top_k == 7
    tiny.client.completions.create(model="tiny", prompt=[5], max_tokens=2,
                                   extra_body={"response_format": {"type": "text"}})
    assert tiny.submitted[-1][0].structured is None


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_logit_bias_moves_the_greedy_choice(tiny, tokenizer, endpoint):
    """+100 on one token makes every greedy token that one; -100 on the unbiased greedy
    first token makes the first token the runner-up."""
    prompt = tokenizer.encode("The weather today")

    def reply_tokens(bias: dict[int, float]) -> list[str]:
        if endpoint == "chat":
            reply = tiny.client.chat.completions.create(
                model="tiny", messages=CHAT, max_tokens=4, temperature=0, logprobs=True,
                logit_bias={str(t): b for t, b in bias.items()})
            return [entry.token for entry in reply.choices[0].logprobs.content]
        reply = tiny.client.completions.create(
            model="tiny", prompt=prompt, max_tokens=4, temperature=0, logprobs=0,
            logit_bias={str(t): b for t, b in bias.items()})
        return reply.choices[0].logprobs.tokens

    forced = tokenizer.encode(" sun")[0]
    assert reply_tokens({forced: 100}) == [tokenizer.decode([forced])] * 4
    if endpoint == "completions":
        first = greedy_tokens(tiny.model, prompt, 1, {})[0]
        runner_up = greedy_tokens(tiny.model, prompt, 1, {first: -100})[0]
        assert reply_tokens({})[0] == tokenizer.decode([first])
        assert reply_tokens({first: -100})[0] == tokenizer.decode([runner_up]) != \
            tokenizer.decode([first])


def test_best_of_returns_the_most_likely_samples(tiny):
    request = dict(model="tiny", prompt="Once upon a time", max_tokens=6, temperature=1.0,
                   seed=11)
    best = tiny.client.completions.create(n=2, best_of=4, **request)
    every = tiny.client.completions.create(n=4, logprobs=0, **request)  # the same 4 samples
    ranked = sorted(every.choices, key=lambda c: sum(c.logprobs.token_logprobs), reverse=True)
    assert [c.text for c in best.choices] == [c.text for c in ranked[:2]]
    assert [c.index for c in best.choices] == [0, 1]
    assert all(c.logprobs is None for c in best.choices)  # recorded to rank, not asked for
    assert best.usage == every.usage  # all four samples were generated


def test_echo_puts_the_prompt_before_each_choice(tiny, tokenizer):
    request = dict(model="tiny", max_tokens=4, temperature=0)
    plain = tiny.client.completions.create(prompt="Hello there", **request)
    echoed = tiny.client.completions.create(prompt="Hello there", echo=True, n=2, **request)
    assert [c.text for c in echoed.choices] == ["Hello there" + plain.choices[0].text] * 2
    ids = tokenizer.encode("Good morning")
    by_ids = tiny.client.completions.create(prompt=ids, echo=True, **request)
    assert by_ids.choices[0].text.startswith(tokenizer.decode(ids))
    chunks = list(tiny.client.completions.create(prompt="Hello there", echo=True,
                                                 stream=True, **request))
    assert "".join(c.choices[0].text for c in chunks) == echoed.choices[0].text


def test_the_four_prompt_shapes_and_their_choice_indices(tiny, tokenizer):
    """A string, its token ids, a list of strings and a list of id lists: prompt p's
    sample s is choice p * n + s, each as the prompt would get alone, and usage adds up."""
    texts = ["The sea", "A red fox jumps", "Numbers: 1, 2,"]
    request = dict(model="tiny", max_tokens=5, temperature=0.9, seed=3, n=2)
    alone = [tiny.client.completions.create(prompt=text, **request) for text in texts]
    ids = [tokenizer.encode(text) for text in texts]
    assert tiny.client.completions.create(prompt=ids[0], **request).choices == \
        alone[0].choices
    for prompt in (texts, ids):
        together = tiny.client.completions.create(prompt=prompt, **request)
        assert [c.index for c in together.choices] == list(range(6))
        assert [c.text for c in together.choices] == [c.text for a in alone for c in a.choices]
        assert together.usage.prompt_tokens == sum(map(len, ids))
        assert together.usage.completion_tokens == sum(a.usage.completion_tokens
                                                       for a in alone)
        chunks = list(tiny.client.completions.create(prompt=prompt, stream=True, **request))
        for choice in together.choices:
            streamed = "".join(c.choices[0].text for c in chunks
                               if c.choices[0].index == choice.index)
            assert streamed == choice.text


def test_max_completion_tokens_limits_a_chat_reply(tiny):
    reply = tiny.client.chat.completions.create(model="tiny", messages=CHAT, temperature=0,
                                                max_completion_tokens=3)
    assert reply.usage.completion_tokens == 3


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_guided_choice_and_regex_hold(tiny, endpoint):
    def reply(**extra):
        if endpoint == "chat":
            return tiny.client.chat.completions.create(
                model="tiny", messages=CHAT, max_tokens=20, temperature=1.0, seed=2, n=3,
                extra_body=extra).choices
        return tiny.client.completions.create(model="tiny", prompt="Pick:", max_tokens=20,
                                              temperature=1.0, seed=2, n=3, extra_body=extra
                                              ).choices

    def text(choice):
        return choice.message.content if endpoint == "chat" else choice.text

    options = ["red", "green", "light blue"]
    assert all(text(c) in options and c.finish_reason == "stop"
               for c in reply(guided_choice=options))
    pattern = r"[0-9]{3}-[a-z]{2}"
    assert all(re.fullmatch(pattern, text(c)) for c in reply(guided_regex=pattern))


@pytest.mark.smollm2
def test_response_format_json_object_replies_with_an_object(smollm2_server):
    reply = smollm2_server.chat.completions.create(
        model="smollm2", temperature=0, max_tokens=200,
        messages=[{"role": "user", "content": "Describe a cat as a JSON object."}],
        response_format={"type": "json_object"})
    choice = reply.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(json.loads(choice.message.content), dict)


class City(BaseModel):
    name: str
    country: str


@pytest.mark.smollm2
def test_the_openai_client_parses_a_json_schema_reply(smollm2_server):
    """``parse`` sends City's strict JSON schema as response_format and validates the
    reply into a City."""
    reply = smollm2_server.beta.chat.completions.parse(
        model="smollm2", temperature=0, max_tokens=100, response_format=City,
        messages=[{"role": "user", "content": "Name a big city and its country."}])
    city = reply.choices[0].message.parsed
    assert isinstance(city, City) and city.name and city.country
    assert City.model_validate_json(reply.choices[0].message.content) == city
