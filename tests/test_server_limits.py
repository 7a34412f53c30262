"""Limits a public server needs, each a 400 with OpenAI's error body that names it (a body
over a megabyte, sent with or without its length; too many or too long stop strings; a
seed outside 64 bits; a prompt or max_tokens past the context; token ids outside the
vocabulary), and the optional API key (401 without it, the /v1 endpoints served with it,
/health and the chat page open). A tiny model behind it: each request takes milliseconds."""

from __future__ import annotations

import httpx
import openai
import pytest

from minillm.cli import build_parser
from minillm.serve import LLM
from minillm.serve.server import MAX_BODY_BYTES, serve_in_background
from minillm.testing import saved_varied_model

KEY = "sk-test-0123"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return saved_varied_model(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def url(checkpoint):
    with serve_in_background(LLM(checkpoint, block_size=4, num_blocks=64), "tiny") as url:
        yield url


def post(url, body=None, content=None, headers=None):
    return httpx.post(url + "/v1/completions", json=body, content=content, timeout=30,
                      headers={"Content-Type": "application/json", **(headers or {})})


def assert_refused(reply, status=400, param=None, code=None):
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert error["message"] and error["type"] == "invalid_request_error"
    assert error["param"] == param and (code is None or error["code"] == code)


BAD = {
    "five stop strings": ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    "a long stop string": ({"stop": "x" * 257}, "stop"),
    "an empty stop string": ({"stop": [""]}, "stop"),
    "a seed past 64 bits": ({"seed": 2**63}, "seed"),
    "max_tokens past the context": ({"max_tokens": 500}, "prompt"),
    "a prompt past the context": ({"prompt": list(range(1, 200))}, "prompt"),
    "token ids outside the vocabulary": ({"prompt": [5, 300, 7]}, "prompt"),
    "n of 5": ({"n": 5}, "n"),
}


@pytest.mark.parametrize("change, param", BAD.values(), ids=BAD.keys())
def test_limits_are_clear_400s_and_the_server_goes_on(url, change, param):
    assert_refused(post(url, {"model": "tiny", "prompt": [5, 17, 99], **change}), param=param)
    assert post(url, {"model": "tiny", "prompt": [5, 17, 99], "max_tokens": 3}).status_code == 200


def test_a_body_over_a_megabyte_is_refused_with_or_without_its_length(url):
    huge = b'{"model": "tiny", "prompt": "' + b"a" * MAX_BODY_BYTES + b'"}'
    assert_refused(post(url, content=huge), code="request_too_large")

    def chunks():  # no Content-Length: the server counts what arrives
        yield huge[:MAX_BODY_BYTES // 2]
        yield huge[MAX_BODY_BYTES // 2:]

    assert_refused(post(url, content=chunks()), code="request_too_large")
    assert post(url, {"model": "tiny", "prompt": [5], "max_tokens": 2}).status_code == 200


def test_an_api_key_guards_the_v1_endpoints(checkpoint):
    llm = LLM(checkpoint, block_size=4, num_blocks=32)
    with serve_in_background(llm, "tiny", api_key=KEY) as url:
        body = {"model": "tiny", "prompt": [5, 17], "max_tokens": 2}
        assert_refused(post(url, body), status=401, code="invalid_api_key")
        assert_refused(post(url, body, headers={"Authorization": "Bearer wrong"}), status=401,
                       code="invalid_api_key")
        assert httpx.get(url + "/v1/models").status_code == 401
        client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
        assert client.completions.create(**body).usage.completion_tokens == 2
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0) \
                .completions.create(**body)
        assert httpx.get(url + "/health").status_code == 200
        assert httpx.get(url + "/").status_code == 200


def test_the_server_listens_on_this_machine_only_unless_told():
    args = build_parser().parse_args(["serve"])
    assert args.host == "127.0.0.1" and args.api_key is None
