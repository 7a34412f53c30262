"""The HTTP server against the in-process engine, on the same trace (SmolLM2, this CPU).

    python benchmarks/server.py                      # the table in docs/benchmarks.md
    python benchmarks/server.py --requests 32 --concurrency 8

The trace: ``--requests`` chat prompts of :func:`minillm.experiments.workload.make_trace`
(questions and passages to summarise, long-tailed output lengths), greedy.

* **in-process**: ``LLM.generate`` on every request at once (max batch = concurrency);
* **HTTP**: ``minillm serve`` in its own process (same max batch), and ``concurrency``
  clients of the official ``openai`` async client streaming ``/v1/completions`` (the prompt
  sent as token ids, so both paths see the same tokens), each starting its next request
  when the last one ends.

Throughput is completion tokens over the wall time of the whole trace. TTFT is measured
by the HTTP clients (request sent -> first chunk); the in-process run queues all requests
at once, so its "TTFT" would mostly be queueing and is not printed. The texts of both
paths are compared.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time

import httpx
import numpy as np
import openai

from minillm import SamplingParams, Tokenizer
from minillm.data import load_documents
from minillm.experiments.workload import make_trace
from minillm.parallel.launch import free_port
from minillm.serve import LLM, SchedulerConfig


def in_process(trace, concurrency: int, tokenizer) -> dict:
    llm = LLM("smollm2", scheduler=SchedulerConfig(max_batch=concurrency))
    llm.generate([trace[0].prompt], SamplingParams(max_tokens=4), progress=False)  # warm-up
    params = [SamplingParams(max_tokens=r.max_tokens) for r in trace]
    start = time.perf_counter()
    outputs = llm.generate([r.prompt for r in trace], params, progress=False)
    seconds = time.perf_counter() - start
    return {"texts": [tokenizer.decode(o.tokens) for o in outputs], "seconds": seconds,
            "tokens": sum(len(o.tokens) for o in outputs)}


async def _one(client, request, ttfts: list, texts: dict, index: int) -> int:
    start = time.perf_counter()
    stream = await client.completions.create(
        model="smollm2", prompt=request.prompt, max_tokens=request.max_tokens, temperature=0,
        stream=True, stream_options={"include_usage": True})
    pieces, tokens = [], 0
    async for chunk in stream:
        if not pieces and chunk.choices:
            ttfts.append(time.perf_counter() - start)
        if chunk.choices:
            pieces.append(chunk.choices[0].text)
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    texts[index] = "".join(pieces)
    return tokens


async def _clients(url: str, trace, concurrency: int) -> dict:
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="-", max_retries=0,
                                timeout=600)
    queue = list(enumerate(trace))
    ttfts, texts, counts = [], {}, []

    async def worker():
        while queue:
            index, request = queue.pop(0)
            counts.append(await _one(client, request, ttfts, texts, index))

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return {"texts": [texts[i] for i in range(len(trace))], "tokens": sum(counts),
            "seconds": time.perf_counter() - start, "ttft": ttfts}


def over_http(trace, concurrency: int) -> dict:
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "minillm", "serve", "--port", str(port),
                               "--max-batch", str(concurrency)])
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        asyncio.run(_clients(url, trace[:1], 1))  # warm-up
        return asyncio.run(_clients(url, trace, concurrency))
    finally:
        server.terminate()
        server.wait(timeout=30)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--median-tokens", type=int, default=32)
    args = parser.parse_args(argv)
    tokenizer = Tokenizer("smollm2")
    trace = make_trace(tokenizer, args.requests, rate=0, median_tokens=args.median_tokens,
                       passages=load_documents("sotu", "train")[:200])
    local = in_process(trace, args.concurrency, tokenizer)
    http = over_http(trace, args.concurrency)
    same = sum(a == b for a, b in zip(local["texts"], http["texts"], strict=True))
    print(f"{args.requests} requests, {args.concurrency} at a time, greedy; "
          f"texts equal on both paths: {same} of {args.requests}\n")
    print("| path | output tokens | seconds | tokens/s | TTFT p50 | TTFT p95 | vs in-process |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    base = local["tokens"] / local["seconds"]
    for name, run in (("in-process engine", local), ("HTTP, openai client", http)):
        rate = run["tokens"] / run["seconds"]
        ttft = "| - | - " if "ttft" not in run else \
            "".join(f"| {t:.2f} s " for t in np.percentile(run["ttft"], [50, 95]))
        print(f"| {name} | {run['tokens']} | {run['seconds']:.1f} | {rate:.1f} {ttft}"
              f"| {rate / base:.2f}x |")


if __name__ == "__main__":
    main()
