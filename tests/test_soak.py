"""A bounded soak test on loopback: 1,000 requests from the official ``openai`` client (its
async flavour, 32 at a time), of which 10% hang up mid-stream and 5% are cancelled before
they finish. Afterwards every KV block is free and the engine idle, every request that
ran to its end got its own text (none lost, none mixed up with another's, ids unique), and
the server process grew by less than 5% in memory after warm-up."""

from __future__ import annotations

import asyncio
import random

import openai
import pytest

from minillm import Tokenizer, reference
from minillm.checkpoint import resolve_checkpoint, save_model
from minillm.config import ModelConfig
from minillm.quant.checkpoint import copy_tokenizer_files
from minillm.serve import LLM, SchedulerConfig
from minillm.serve.server import serve_in_background
from minillm.testing import TINY, varied_random_model

REQUESTS, CONCURRENCY, WARM_UP = 1000, 32, 100
PROMPTS = [[(7 * i + j) % 250 + 3 for j in range(3 + i % 9)] for i in range(20)]
BLOCKS = 256


def rss_bytes() -> int:
    """This process's resident memory (the server runs in one of its threads)."""
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


async def one_request(client, index: int, kind: str):
    prompt, max_tokens = PROMPTS[index % len(PROMPTS)], 4 + index % 9
    request = dict(model="tiny", prompt=prompt, max_tokens=max_tokens, temperature=0)
    if kind == "hang up":
        stream = await client.completions.create(stream=True, **request)
        async for _ in stream:
            break  # the first chunk, then close the connection
        await stream.close()
        return kind, index, None
    call = asyncio.ensure_future(client.completions.create(**request))
    if kind == "cancel":
        await asyncio.sleep(random.Random(index).uniform(0.0, 0.02))
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        return kind, index, None
    reply = await call
    return kind, index, reply


async def load(url: str, indices: range) -> list:
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="-", max_retries=0, timeout=120)
    limit = asyncio.Semaphore(CONCURRENCY)
    draw = random.Random(0)
    kinds = {i: draw.choices(["full", "hang up", "cancel"], [0.85, 0.10, 0.05])[0]
             for i in indices}

    async def bounded(i):
        async with limit:
            return await one_request(client, i, kinds[i])

    try:
        return await asyncio.gather(*(bounded(i) for i in indices))
    finally:
        await client.close()


@pytest.mark.slow
def test_a_thousand_requests_with_hang_ups_and_cancels_leave_nothing_behind(tmp_path):
    save_model(varied_random_model(ModelConfig(**TINY)), tmp_path)
    copy_tokenizer_files(resolve_checkpoint("smollm2"), tmp_path)
    llm = LLM(str(tmp_path), block_size=4, num_blocks=BLOCKS,
              scheduler=SchedulerConfig(max_batch=CONCURRENCY))
    tokenizer = Tokenizer(str(tmp_path))
    expected = {}
    for i in range(len(PROMPTS) * 9):
        prompt, max_tokens = PROMPTS[i % len(PROMPTS)], 4 + i % 9
        tokens = reference.generate(llm.model, prompt, max_tokens,
                                    stop_tokens=tokenizer.stop_tokens)[0]
        expected[i % len(PROMPTS), max_tokens] = tokenizer.decode(
            [t for t in tokens if t not in tokenizer.stop_tokens])
    with serve_in_background(llm, "tiny") as url:
        warm = asyncio.run(load(url, range(WARM_UP)))
        before = rss_bytes()
        results = warm + asyncio.run(load(url, range(WARM_UP, REQUESTS)))
        after = rss_bytes()
        full = [(i, reply) for kind, i, reply in results if kind == "full"]
        assert len(results) == REQUESTS and len(full) > 0.8 * REQUESTS
        assert sum(kind == "hang up" for kind, *_ in results) > 0.05 * REQUESTS
        assert sum(kind == "cancel" for kind, *_ in results) > 0.02 * REQUESTS
        for i, reply in full:  # each its own text: nothing lost or mixed up
            assert reply.choices[0].text == expected[i % len(PROMPTS), 4 + i % 9]
        assert len({reply.id for _, reply in full}) == len(full)
        engine = llm  # the server's engine: once the last cancellation is applied, idle
        for _ in range(200):
            if engine.free_blocks() == BLOCKS and not engine.has_work:
                break
            asyncio.run(asyncio.sleep(0.05))
        assert engine.free_blocks() == BLOCKS and not engine.has_work
    assert after < 1.05 * before, (before, after)
