"""Faults, injected: a step that raises fails only its own requests and frees their blocks;
an engine that cannot go on says so (``/health`` 503, waiting requests fail at once, new
ones get 503) and never hangs; a tensor-parallel worker that dies or hangs mid-step is
detected within seconds; ``SIGTERM`` stops ``minillm serve`` even while a step is stuck;
a pool too small for the load still serves every request."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from engine_driving import sequence_of

from minillm.checkpoint import resolve_checkpoint, save_model
from minillm.config import ModelConfig
from minillm.engine import EngineConfig, EngineCore
from minillm.engine.errors import EngineDeadError
from minillm.parallel.launch import free_port
from minillm.quant.checkpoint import copy_tokenizer_files
from minillm.reference import generate  # the oracle: the course's dense loop
from minillm.sampling import SamplingParams
from minillm.serve import LLM, SchedulerConfig
from minillm.serve.server import serve_in_background
from minillm.testing import TINY, varied_random_model

PROMPTS = [[5, 17, 99, 3, 42, 7, 8], [1, 2], [200, 100, 50, 25], list(range(30, 50)),
           [9] * 13, [4, 4, 8, 15, 16, 23, 42]]


class FailingRunner:
    """Wraps an engine's runner: step ``fail_at`` (counting from 1) raises ``error``
    instead of computing; it remembers which requests that step held."""

    def __init__(self, runner, fail_at: int, error: Exception):
        self.runner, self.fail_at, self.error = runner, fail_at, error
        self.steps, self.failed_ids = 0, set()

    def run(self, step, drafts):
        self.steps += 1
        if self.steps == self.fail_at:
            self.failed_ids = {seq.request_id for seq, _ in step.work}
            raise self.error
        return self.runner.run(step, drafts)

    def __getattr__(self, name):
        return getattr(self.runner, name)


@pytest.fixture(scope="module")
def tiny():
    return varied_random_model(ModelConfig(**TINY))


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory, tiny):
    """The tiny model saved with SmolLM2's tokenizer files (a server wants a tokenizer;
    its requests here are token ids below the tiny vocabulary)."""
    directory = tmp_path_factory.mktemp("tiny")
    save_model(tiny, directory)
    copy_tokenizer_files(resolve_checkpoint("smollm2"), directory)
    return str(directory)


def engine(model, fail_at=None, error=None, **scheduler) -> LLM:
    llm = LLM(model, block_size=4, num_blocks=64,
              scheduler=SchedulerConfig(**{"max_batch": 2, **scheduler}))
    if fail_at is not None:
        llm.core.runner = FailingRunner(llm.core.runner, fail_at, error)
    return llm


def alone(model, prompt, max_tokens=8) -> list[int]:
    return generate(model, prompt, max_tokens)[0]


def test_a_failing_step_fails_its_requests_only_and_the_engine_goes_on(tiny):
    llm = engine(tiny, fail_at=3, error=RuntimeError("injected fault"))
    outputs = llm.generate(PROMPTS, SamplingParams(max_tokens=8), progress=False)
    failed = llm.core.runner.failed_ids
    assert 0 < len(failed) < len(PROMPTS)
    for prompt, out in zip(PROMPTS, outputs, strict=True):
        if out.request_id in failed:
            assert out.finish_reason == "error" and "injected fault" in out.error
            assert "other requests were not affected" in out.error
        else:
            assert out.error is None and out.tokens == alone(tiny, prompt)
    assert llm.free_blocks() == llm.blocks.num_blocks
    again = llm.generate([PROMPTS[0]], SamplingParams(max_tokens=8), progress=False)[0]
    assert again.tokens == alone(tiny, PROMPTS[0])


def test_a_failing_step_during_forked_samples_frees_every_block(tiny):
    llm = engine(tiny, fail_at=2, error=ValueError("boom"), max_batch=4)
    params = SamplingParams(temperature=1.0, seed=5, n=3, max_tokens=6)
    out = llm.generate([PROMPTS[3]], params, progress=False)[0]
    assert {o.finish_reason for o in out.outputs} == {"error"}
    assert llm.free_blocks() == llm.blocks.num_blocks and not llm.has_work


@pytest.mark.parametrize("fail_at", [1, 3])  # the prompts' step, or one with forked samples
def test_a_failed_steps_deltas_fail_exactly_that_steps_requests(tiny, fail_at):
    engine_core = EngineCore(tiny, EngineConfig(block_size=4, num_blocks=64,
                                                scheduler=SchedulerConfig(max_batch=4)))
    runner = engine_core.runner = FailingRunner(engine_core.runner, fail_at,
                                                RuntimeError("injected fault"))
    params = [SamplingParams(max_tokens=8),  # 1 + 3 seats: the others wait their turn
              SamplingParams(temperature=1.0, seed=5, n=3, max_tokens=8),
              SamplingParams(max_tokens=8), SamplingParams(max_tokens=8)]
    for request, (prompt, sp) in enumerate(zip(PROMPTS, params, strict=False)):
        engine_core.add(request, prompt, sp)
    tokens = {}
    for step in range(1, 100):
        if not engine_core.has_work:
            break
        deltas = engine_core.step()
        errors = [d for d in deltas if d.error is not None]
        if step != fail_at:
            assert not errors and all(d.finish_reason != "error" for d in deltas)
            for d in deltas:
                tokens[d.request_id, d.index] = tokens.get((d.request_id, d.index), ()) + \
                    d.token_ids
            continue
        assert runner.failed_ids == {0, 1}  # the step held the first two requests
        assert sorted((d.request_id, d.index) for d in deltas) == \
            [(0, 0), (1, 0), (1, 1), (1, 2)]  # every sample of them, forked or not
        for d in deltas:
            assert d.finish_reason == "error" and not d.token_ids
            assert "injected fault" in d.error and "other requests were not affected" in d.error
        assert 0 not in engine_core.requests and 1 not in engine_core.requests
    assert {key for key in tokens if key[0] >= 2} == {(2, 0), (3, 0)}
    for request in (2, 3):  # the others went on, untouched
        assert list(tokens[request, 0]) == alone(tiny, PROMPTS[request])
    assert engine_core.blocks.num_free == 64 and not engine_core.requests


def test_a_dead_engine_fails_everything_and_refuses_more(tiny):
    llm = engine(tiny, fail_at=2, error=EngineDeadError("worker 1 exited"))
    requests = [llm.add_request(p, SamplingParams(max_tokens=8)) for p in PROMPTS]
    seqs = [sequence_of(llm, request) for request in requests]
    llm.step()
    with pytest.raises(EngineDeadError, match="worker 1 exited"):
        llm.step()
    assert all(s.finished and s.error == "worker 1 exited" for s in seqs)
    outputs = [llm.output(request) for request in requests]
    assert all(o.finish_reason == "error" and o.error == "worker 1 exited" for o in outputs)
    assert llm.core.dead == "worker 1 exited" and not llm.core.requests
    assert llm.free_blocks() == llm.blocks.num_blocks
    with pytest.raises(EngineDeadError):
        llm.add_request([1, 2, 3])
    with pytest.raises(EngineDeadError):
        llm.step()


def test_a_pool_too_small_for_the_load_still_serves_everyone(tiny):
    llm = LLM(tiny, block_size=4, num_blocks=10,
              scheduler=SchedulerConfig(max_batch=6, max_tokens_per_step=16))
    prompts = PROMPTS * 2
    outputs = llm.generate(prompts, SamplingParams(max_tokens=12), progress=False)
    assert [o.tokens for o in outputs] == [alone(tiny, p, 12) for p in prompts]
    assert llm.free_blocks() == 10


# -- over HTTP -------------------------------------------------------------------------

def complete(url, prompt, stream=False, max_tokens=8):
    client = openai.OpenAI(base_url=url + "/v1", api_key="-", max_retries=0, timeout=30)
    request = dict(model="tiny", prompt=prompt, max_tokens=max_tokens, temperature=0)
    if stream:
        return "".join(c.choices[0].text for c in client.completions.create(stream=True,
                                                                            **request))
    return client.completions.create(**request).choices[0].text


def test_over_http_a_failed_step_is_a_500_and_the_others_go_on(tiny_checkpoint):
    llm = LLM(tiny_checkpoint, block_size=4, num_blocks=64,
              scheduler=SchedulerConfig(max_batch=1))
    llm.core.runner = FailingRunner(llm.core.runner, fail_at=3,
                                    error=RuntimeError("injected fault"))
    with serve_in_background(llm, "tiny") as url:
        with pytest.raises(openai.InternalServerError, match="injected fault") as caught:
            complete(url, PROMPTS[0])
        assert caught.value.body["type"] == "server_error"
        assert complete(url, PROMPTS[1]) == llm.tokenizer.decode(alone(llm.model, PROMPTS[1]))
        llm.core.runner.steps, llm.core.runner.fail_at = 0, 2
        with pytest.raises(openai.APIError, match="injected fault"):
            complete(url, PROMPTS[0], stream=True)
        assert complete(url, PROMPTS[2], stream=True) == \
            llm.tokenizer.decode(alone(llm.model, PROMPTS[2]))
        assert httpx.get(url + "/health").json() == {"status": "ok"}
    assert llm.free_blocks() == 64


def test_over_http_a_dead_engine_answers_503_and_never_hangs(tiny_checkpoint):
    llm = LLM(tiny_checkpoint, block_size=4, num_blocks=64,
              scheduler=SchedulerConfig(max_batch=1))
    llm.core.runner = FailingRunner(llm.core.runner, fail_at=4,
                                    error=EngineDeadError("worker 1 died"))
    stopped = []
    with serve_in_background(llm, "tiny", on_engine_stop=stopped.append) as url:
        with ThreadPoolExecutor(3) as pool:  # one runs, two wait; all three must fail
            replies = [pool.submit(complete, url, p, max_tokens=30) for p in PROMPTS[:3]]
            for reply in replies:
                with pytest.raises(openai.APIStatusError, match="worker 1 died"):
                    reply.result(timeout=30)
        health = httpx.get(url + "/health")
        assert health.status_code == 503 and "worker 1 died" in health.json()["message"]
        started = time.monotonic()
        with pytest.raises(openai.APIStatusError, match="worker 1 died") as caught:
            complete(url, PROMPTS[3])
        assert caught.value.status_code == 503 and time.monotonic() - started < 5
    assert stopped == ["worker 1 died"] and llm.free_blocks() == 64


# -- tensor parallelism: a worker that dies or hangs -------------------------------------

def worker_pids(process_or_pid) -> list[int]:
    """The process ids of a process's children (its tensor-parallel workers)."""
    pid = process_or_pid if isinstance(process_or_pid, int) else process_or_pid.pid
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True,
                         text=True).stdout
    return [int(p) for p in out.split()]


def tp_worker_pids(llm: LLM) -> list[int]:
    return [p.pid for p in llm.core.runner.workers]


@pytest.mark.parametrize("fault, signal_number", [("killed", signal.SIGKILL),
                                                  ("hung", signal.SIGSTOP)])
def test_a_tensor_parallel_worker_that_dies_or_hangs_is_detected_in_seconds(
        tiny_checkpoint, fault, signal_number):
    llm = LLM(tiny_checkpoint, block_size=4, num_blocks=64, tensor_parallel_size=2,
              worker_timeout=3.0, scheduler=SchedulerConfig(max_batch=2))
    try:
        requests = [llm.add_request(p, SamplingParams(max_tokens=50)) for p in PROMPTS]
        outputs = [llm.outputs[request] for request in requests]
        llm.step()
        threading.Timer(0.2, os.kill, (tp_worker_pids(llm)[0], signal_number)).start()
        started = time.monotonic()
        with pytest.raises(EngineDeadError) as caught:
            while llm.has_work:
                llm.step()
        took = time.monotonic() - started
        assert ("exited" if fault == "killed" else "did not answer within") in str(caught.value)
        assert took < (4 if fault == "killed" else 8), took
        assert all(o.finished for o in outputs)  # some may have met a stop token before
        assert any(o.finish_reason == "error" and o.error == str(caught.value)
                   for o in outputs)
        assert llm.free_blocks() == 64
    finally:
        started = time.monotonic()
        llm.close()
        assert time.monotonic() - started < 10
    assert all(p.poll() is not None for p in llm.core.runner.workers)


# -- minillm serve as a process ----------------------------------------------------------

def start_server(checkpoint, *options):
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "minillm", "serve", "--model", checkpoint,
                                "--served-name", "tiny", "--port", str(port), *options],
                               stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if httpx.get(url + "/health").status_code == 200:
                return process, url
        except httpx.TransportError:
            time.sleep(0.2)
    process.kill()
    raise AssertionError("minillm serve did not start:\n" + process.stderr.read())


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)  # a stopped process dies too (and is not left over)


def test_sigterm_stops_the_server_while_a_step_is_stuck(tiny_checkpoint):
    process, url = start_server(tiny_checkpoint, "--tensor-parallel", "2",
                                "--worker-timeout", "600")
    workers = worker_pids(process)  # recorded now: once the server exits they are orphans
    try:
        assert complete(url, PROMPTS[0]) is not None
        assert workers  # the tensor-parallel worker (and the spawn helper)
        for pid in workers:
            os.kill(pid, signal.SIGSTOP)  # every child frozen: the next step cannot finish
        stuck = ThreadPoolExecutor(1)
        stuck.submit(complete, url, PROMPTS[1])  # its step cannot finish
        time.sleep(1.0)
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=15)
        assert time.monotonic() - started < 10
        stuck.shutdown(wait=False)
    finally:
        kill_all(workers + worker_pids(process))
        process.kill()
        process.wait()


def test_a_dead_worker_makes_minillm_serve_exit_with_an_error(tiny_checkpoint):
    process, url = start_server(tiny_checkpoint, "--tensor-parallel", "2")
    workers = worker_pids(process)
    try:
        assert complete(url, PROMPTS[0]) is not None
        kill_all(workers)
        with pytest.raises((openai.APIStatusError, openai.APIConnectionError)):
            complete(url, PROMPTS[1])
        assert process.wait(timeout=20) == 1
        assert "the engine stopped" in process.stderr.read()
    finally:
        kill_all(workers)
        process.kill()
        process.wait()
