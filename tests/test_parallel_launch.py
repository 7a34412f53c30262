"""Starting a tensor-parallel engine: from a plain script (the workers are ``python -m``
processes that never import it), and under torchrun, on one "machine" or two on
loopback (``--nnodes 2``), for ``LLM(...)`` and ``minillm serve``; the tokens equal one
process's."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from minillm.parallel.launch import free_port
from minillm.sampling import SamplingParams
from minillm.serve import LLM
from minillm.testing import saved_varied_model

PROMPTS = [[5, 17, 99, 3, 42], [1, 2, 3], [200, 100, 50, 25, 12, 6]]
README = Path(__file__).resolve().parents[1] / "README.md"

ENGINE_SCRIPT = """
import json, sys
from minillm import SamplingParams
from minillm.serve import LLM

with LLM(sys.argv[1], num_blocks=64, block_size=4, tensor_parallel_size=2) as llm:
    outputs = llm.generate({prompts}, SamplingParams(max_tokens=8), progress=False)
    print("TOKENS", json.dumps([o.tokens for o in outputs]))
"""


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return saved_varied_model(tmp_path_factory.mktemp("varied"))


@pytest.fixture(scope="module")
def one_process(checkpoint):
    with LLM(checkpoint, num_blocks=64, block_size=4) as llm:
        return [o.tokens for o in llm.generate(PROMPTS, SamplingParams(max_tokens=8),
                                               progress=False)]


def tokens_printed(output: str) -> list[list[int]]:
    return json.loads(re.search(r"^TOKENS (.*)$", output, re.MULTILINE).group(1))


def run(command: list[str], cwd: Path, timeout: float = 240) -> str:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def test_an_unguarded_script_starts_the_engine_with_plain_python(tmp_path, checkpoint,
                                                                 one_process):
    """No ``if __name__ == "__main__":``: multiprocessing's spawn would run the script again
    in every worker; ``python -m minillm.engine.worker`` does not."""
    script = tmp_path / "tp.py"
    script.write_text(ENGINE_SCRIPT.format(prompts=PROMPTS))
    done = subprocess.run([sys.executable, str(script), checkpoint], cwd=tmp_path,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert tokens_printed(done.stdout) == one_process
    # the package does not import the worker's module, so runpy runs it without warning
    assert "found in sys.modules" not in done.stderr, done.stderr[-3000:]


def test_under_torchrun_on_one_machine(tmp_path, checkpoint, one_process):
    script = tmp_path / "tp.py"
    script.write_text(ENGINE_SCRIPT.format(prompts=PROMPTS))
    output = run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
                  f"--master-port={free_port()}", str(script), checkpoint], tmp_path)
    assert tokens_printed(output) == one_process


def test_under_torchrun_on_two_machines_over_loopback(tmp_path, checkpoint, one_process):
    """Two torchrun invocations with ``--nnodes 2``: each "machine" runs one rank."""
    script = tmp_path / "tp.py"
    script.write_text(ENGINE_SCRIPT.format(prompts=PROMPTS))
    port = free_port()
    nodes = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes=2",
                               f"--node-rank={node}", "--nproc-per-node=1",
                               "--master-addr=127.0.0.1", f"--master-port={port}", str(script),
                               checkpoint], cwd=tmp_path, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for node in (0, 1)]
    outputs = [node.communicate(timeout=240) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs
    assert tokens_printed(outputs[0][0]) == one_process


def test_minillm_serve_under_torchrun(tmp_path, checkpoint, one_process):
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "torch.distributed.run",
                               "--nproc-per-node=2", f"--master-port={free_port()}", "-m",
                               "minillm", "serve", "--model", checkpoint, "--served-name", "tiny",
                               "--tensor-parallel", "2", "--port", str(port),
                               "--num-blocks", "64"], cwd=tmp_path, stderr=subprocess.PIPE,
                              text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and server.poll() is None:
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.3)
        texts = []
        for prompt in PROMPTS:
            reply = httpx.post(url + "/v1/completions", timeout=60, json={
                "model": "tiny", "prompt": prompt, "max_tokens": 8, "temperature": 0})
            texts.append(reply.json()["choices"][0]["text"])
        from minillm import Tokenizer

        tokenizer = Tokenizer(checkpoint)
        assert texts == [tokenizer.decode([t for t in tokens if t not in tokenizer.stop_tokens])
                         for tokens in one_process]
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) is not None


@pytest.mark.smollm2
@pytest.mark.slow
def test_the_readme_tensor_parallel_snippet_runs_as_a_script(tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL)
    block = next(b for b in blocks if "tensor_parallel_size=3" in b)
    script = tmp_path / "tp.py"
    script.write_text(textwrap.dedent(block))
    output = run([sys.executable, str(script)], tmp_path, timeout=600)
    assert "Paris" in output
