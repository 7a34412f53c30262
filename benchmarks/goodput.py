"""Goodput of ``minillm serve`` on this CPU: requests per second that meet a latency SLO,
as the number of concurrent clients rises, until it breaks.

    python benchmarks/goodput.py                       # 1 .. 64 clients, SmolLM2 fp32
    python benchmarks/goodput.py --concurrency 4 16 --seconds 30

The server runs as its own process (``minillm serve``, default engine: continuous
batching, prefix caching, native decode steps). The load is the official ``openai``
client's async flavour in a bounded loop: at concurrency C, C clients each send requests
back to back for ``--seconds``, streaming, with usage: chat questions and passages to
summarise, already in the chat template (token-id prompts to ``/v1/completions``), with
long-tailed answer lengths (:func:`minillm.experiments.workload.make_trace`).

Per request: TTFT (send to first text) and TPOT ((last text − first text) / (tokens − 1)).
The SLO, stated here and in the table: **TTFT ≤ 2 s and TPOT ≤ 250 ms**, per request.
Goodput is the requests that met it, per second of the run; the table also gives the
throughput and the P95s, so where the SLO breaks is visible.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time

import httpx
import numpy as np
import openai

from minillm import Tokenizer
from minillm.data import load_documents
from minillm.experiments.workload import make_trace
from minillm.parallel.launch import free_port

TTFT_SLO, TPOT_SLO = 2.0, 0.25


async def one_request(client, prompt: list[int], max_tokens: int
                      ) -> tuple[float, float | None, int]:
    """(TTFT, TPOT or None for a one-token answer, tokens) of one streamed request."""
    sent = time.perf_counter()
    first = last = None
    tokens = 0
    stream = await client.completions.create(
        model="smollm2", prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True,
        stream_options={"include_usage": True})
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            last = time.perf_counter()
            first = first or last
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    first = first or time.perf_counter()
    tpot = (last - first) / (tokens - 1) if last is not None and tokens > 1 else None
    return first - sent, tpot, tokens


async def run_level(url: str, trace, clients: int, seconds: float) -> dict:
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="-", max_retries=0,
                                timeout=600)
    results, deadline = [], time.perf_counter() + seconds
    queue = iter(range(10**9))

    async def user():
        while time.perf_counter() < deadline:
            request = trace[next(queue) % len(trace)]
            results.append(await one_request(client, request.prompt, request.max_tokens))

    started = time.perf_counter()
    await asyncio.gather(*(user() for _ in range(clients)))
    elapsed = time.perf_counter() - started
    await client.close()
    ttfts = [r[0] for r in results]
    tpots = [r[1] for r in results if r[1] is not None]
    good = sum(1 for ttft, tpot, _ in results
               if ttft <= TTFT_SLO and (tpot is None or tpot <= TPOT_SLO))
    return {"clients": clients, "requests": len(results), "seconds": elapsed,
            "tokens/s": sum(r[2] for r in results) / elapsed,
            "ttft p50": statistics.median(ttfts), "ttft p95": float(np.percentile(ttfts, 95)),
            "tpot p50": statistics.median(tpots) if tpots else 0.0,
            "tpot p95": float(np.percentile(tpots, 95)) if tpots else 0.0,
            "goodput": good / elapsed, "met": good / max(len(results), 1)}


def start_server(options: list[str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "minillm", "serve", "--port", str(port),
                               *options])
    url = f"http://127.0.0.1:{port}"
    while True:
        try:
            if httpx.get(url + "/health").status_code == 200:
                return server, url
        except httpx.TransportError:
            if server.poll() is not None:
                raise RuntimeError("minillm serve did not start") from None
            time.sleep(0.5)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--median-tokens", type=int, default=48)
    parser.add_argument("--server-options", default="--max-batch 64 --num-blocks 2048",
                        help="options for minillm serve")
    args = parser.parse_args(argv)
    tokenizer = Tokenizer("smollm2")
    trace = make_trace(tokenizer, 256, rate=0, median_tokens=args.median_tokens,
                       passages=load_documents("sotu", "train")[:200])
    server, url = start_server(args.server_options.split())
    try:
        print(f"minillm serve {args.server_options}; SLO: TTFT <= {TTFT_SLO} s and TPOT <= "
              f"{1000 * TPOT_SLO:.0f} ms per request; {args.seconds:.0f} s per level\n")
        print("| clients | requests | tokens/s | TTFT p50 / p95 (s) | TPOT p50 / p95 (ms) "
              "| met the SLO | goodput (requests/s) |")
        print("|---:|---:|---:|---:|---:|---:|---:|")
        for clients in args.concurrency:
            row = asyncio.run(run_level(url, trace, clients, args.seconds))
            print(f"| {clients} | {row['requests']} | {row['tokens/s']:.1f} | "
                  f"{row['ttft p50']:.2f} / {row['ttft p95']:.2f} | "
                  f"{1000 * row['tpot p50']:.0f} / {1000 * row['tpot p95']:.0f} | "
                  f"{100 * row['met']:.0f}% | {row['goodput']:.2f} |", flush=True)
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
