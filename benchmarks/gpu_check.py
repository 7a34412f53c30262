"""Every GPU path of the course checked by one command: `make gpu-check`.

On a machine with CUDA it checks each Triton kernel against PyTorch in float64 (fp32, fp16
and bf16 inputs), the engine on the GPU against the same engine on the CPU token for token,
and times the kernels and the engine (the speed rows). Without CUDA, as in CI, the kernels
run in Triton's interpreter (fp32 and fp16 only: the interpreter gets bf16 wrong), the
engine rows compare the CPU with itself (they prove the script still runs), and the speed
rows are skipped with a message: so the script cannot rot between GPU runs.

It prints one table, writes it as JSON to ``--out`` (for docs/benchmarks.md) and exits 1
if any row is wrong. Speed goals (issue 37) are printed beside the measured ratios; a
missed goal is reported, not failed.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

import torch

CUDA = torch.cuda.is_available()
if not CUDA:  # Triton's interpreter, before anything imports Triton
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch.nn.functional as F  # noqa: E402

from minillm.checkpoint import load_model  # noqa: E402
from minillm.engine.scheduler import SchedulerConfig  # noqa: E402
from minillm.kernels.flash_attention import flash_attention  # noqa: E402
from minillm.kernels.paged_attention import paged_decode_attention  # noqa: E402
from minillm.kernels.w4a16_matmul import w4a16_matmul  # noqa: E402
from minillm.quant.basic import QuantScheme  # noqa: E402
from minillm.quant.qlinear import QuantLinear  # noqa: E402
from minillm.sampling import SamplingParams  # noqa: E402
from minillm.serve import LLM  # noqa: E402
from minillm.testing import tiny_pair  # noqa: E402

DEVICE = "cuda" if CUDA else "cpu"
DTYPES = [torch.float32, torch.float16, torch.bfloat16] if CUDA else [torch.float32,
                                                                       torch.float16]
TOLERANCE = {torch.float32: 2e-4, torch.float16: 2e-2, torch.bfloat16: 6e-2}  # of max |ref|


@dataclass
class Row:
    """One line of the table: what was checked, on what, and how it came out."""

    check: str
    case: str
    result: str  # "ok", "FAIL" or "skipped"
    detail: str = ""


def relative_error(out: torch.Tensor, reference: torch.Tensor) -> float:
    return float((out.double() - reference).abs().max() / reference.abs().max().clamp_min(1e-30))


def compare(check: str, case: str, out: torch.Tensor, reference: torch.Tensor,
            dtype: torch.dtype) -> Row:
    error = relative_error(out, reference)
    ok = error <= TOLERANCE[dtype]
    return Row(check, case, "ok" if ok else "FAIL", f"max error {error:.1e} of max |ref|")


def flash_rows(generator: torch.Generator) -> list[Row]:
    """The FlashAttention forward against float64 attention (causal and not, with GQA)."""
    rows = []
    for dtype in DTYPES:
        for causal in (False, True):
            q = torch.randn(1, 4, 70, 64, generator=generator)
            k, v = (torch.randn(1, 2, 70, 64, generator=generator) for _ in range(2))
            reference = F.scaled_dot_product_attention(
                q.double(), k.double().repeat_interleave(2, 1),
                v.double().repeat_interleave(2, 1), is_causal=causal)
            out, _ = flash_attention(*(t.to(DEVICE, dtype) for t in (q, k, v)), causal=causal)
            rows.append(compare("flash attention", f"{dtype} causal={causal} GQA 4/2",
                                out.cpu(), reference, dtype))
    return rows


def paged_rows(generator: torch.Generator) -> list[Row]:
    """The paged decode kernel against attention over the gathered context, in float64."""
    rows = []
    for dtype in DTYPES:
        pool = [torch.randn(12, 16, 2, 64, generator=generator) for _ in range(2)]
        q = torch.randn(2, 4, 64, generator=generator)
        tables, lengths = torch.tensor([[7, 2, 9], [4, 11, 0]]), torch.tensor([40, 17])
        expected = []
        for s in range(2):
            keys, values = (p[tables[s]].flatten(0, 1)[:lengths[s]].double() for p in pool)
            scores = torch.einsum("hd,thd->ht", q[s].double(), keys.repeat_interleave(2, 1))
            expected.append(torch.einsum("ht,thd->hd", (scores / 8).softmax(-1),
                                         values.repeat_interleave(2, 1)))
        out = paged_decode_attention(q.to(DEVICE, dtype), *(p.to(DEVICE, dtype) for p in pool),
                                     tables.to(DEVICE), lengths.to(DEVICE))
        rows.append(compare("paged decode", f"{dtype} 2 seqs, part-full blocks", out.cpu(),
                            torch.stack(expected), dtype))
    return rows


def quantized_layer(n: int, k: int, seed: int = 0) -> QuantLinear:
    torch.manual_seed(seed)
    return QuantLinear.from_linear(torch.nn.Linear(k, n, bias=False), QuantScheme(4, False, 128))


def w4a16_rows(generator: torch.Generator) -> list[Row]:
    """The W4A16 kernel against dequantize-then-matmul in float64."""
    rows, layer = [], quantized_layer(40, 576)
    for dtype in (d for d in DTYPES if d != torch.bfloat16):  # the kernel takes fp16/fp32
        for m in (1, 17):
            x = torch.randn(m, 576, generator=generator)
            reference = x.double() @ layer.dense_weight().double().T
            out = w4a16_matmul(x.to(DEVICE, dtype), layer.codes.to(DEVICE),
                               layer.scales.to(DEVICE), layer.zeros.to(DEVICE), 128)
            rows.append(compare("w4a16 matmul", f"{dtype} M={m} K=576", out.cpu(), reference,
                                dtype))
    return rows


ENGINE_CASES = {  # name -> (engine options, prompts, sampling params)
    "plain": ({}, [[1, 5, 9, 2], [3, 3, 8]], SamplingParams(max_tokens=12)),
    "prefix hit": ({}, [[4, 5, 6, 7] * 5 + [1], [4, 5, 6, 7] * 5 + [2]],
                   SamplingParams(max_tokens=8)),
    "n = 2": ({}, [[2, 7, 1]], SamplingParams(max_tokens=8, n=2)),
    "speculation": ({"speculative_tokens": 3}, [[6, 1, 6, 1, 6, 1, 6]],
                    SamplingParams(max_tokens=12)),
}


def run_engine(model, executor: str, options: dict, prompts, params) -> list[list[int]]:
    scheduler = SchedulerConfig(speculative_tokens=options.get("speculative_tokens", 0))
    llm = LLM(model, block_size=4, num_blocks=64, executor=executor, scheduler=scheduler)
    llm.generate(prompts, params, progress=False)  # the second run hits the prefix cache
    outputs = llm.generate(prompts, params, progress=False)
    return [sample.tokens for output in outputs for sample in output.outputs]


def engine_rows(model, name: str) -> list[Row]:
    """The engine on DEVICE equals the engine on the CPU, token for token."""
    rows, on_device = [], copy.deepcopy(model).to(DEVICE)
    for executor in ("eager", "compiled"):
        for case, (options, prompts, params) in ENGINE_CASES.items():
            expected = run_engine(model, "eager", options, prompts, params)
            got = run_engine(on_device, executor, options, prompts, params)
            rows.append(Row(f"engine {executor} on {DEVICE}", f"{name}: {case}",
                            "ok" if got == expected else "FAIL",
                            "" if CUDA else "cpu against cpu: checks the script only"))
    return rows


def tensor_parallel_rows() -> list[Row]:
    """Tensor parallelism over NCCL: not checked yet. The engine's ranks are CPU processes in
    a gloo group (minillm.parallel.launch); the row says so rather than pass silently."""
    return [Row("engine tensor parallel (nccl)", "SmolLM2 t=2", "skipped",
                f"the engine's ranks run gloo on CPU processes; {torch.cuda.device_count()} "
                "GPU(s) here")]


def median_seconds(fn, repeats: int = 7) -> float:
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def speed_rows() -> list[Row]:
    """Kernels against PyTorch's own (goals from issue 37), on CUDA only."""
    if not CUDA:
        return [Row("speed", "all", "skipped", "no CUDA device: speed rows need a GPU")]
    rows = []
    for n in (1024, 4096, 16384):
        q, k, v = (torch.randn(1, 8, n, 64, device="cuda", dtype=torch.float16)
                   for _ in range(3))
        ours = median_seconds(lambda: flash_attention(q, k, v, causal=True))  # noqa: B023
        sdpa = median_seconds(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))  # noqa: B023
        rows.append(Row("speed flash/SDPA", f"fp16 causal {n} tokens", "ok",
                        f"{sdpa / ours:.2f}x SDPA's speed (goal >= 0.8x)"))
    layer = quantized_layer(4096, 4096)
    codes, scales, zeros = (t.cuda() for t in (layer.codes, layer.scales, layer.zeros))
    dense = layer.dense_weight().half().cuda()
    for m in (1, 16):
        x = torch.randn(m, 4096, device="cuda", dtype=torch.float16)
        ours = median_seconds(lambda: w4a16_matmul(x, codes, scales, zeros, 128))  # noqa: B023
        fp16 = median_seconds(lambda: x @ dense.T)  # noqa: B023
        rows.append(Row("speed w4a16/fp16", f"4096x4096 M={m}", "ok",
                        f"{fp16 / ours:.2f}x fp16's speed (goal >= 2x at M=1)"))
    q = torch.randn(64, 9, 64, device="cuda", dtype=torch.float16)
    pool = [torch.randn(4096, 16, 3, 64, device="cuda", dtype=torch.float16) for _ in range(2)]
    tables = torch.randperm(4096, device="cuda")[:64 * 64].view(64, 64)
    lengths = torch.full((64,), 1024, device="cuda")
    ours = median_seconds(lambda: paged_decode_attention(q, *pool, tables, lengths))

    def gathered():
        keys, values = (p[tables].flatten(1, 2).transpose(1, 2) for p in pool)
        return F.scaled_dot_product_attention(q[:, :, None], keys, values, enable_gqa=True)

    rows.append(Row("speed paged/gathered", "64 seqs x 1024 tokens fp16", "ok",
                    f"{median_seconds(gathered) / ours:.2f}x gather-then-SDPA's speed"))
    return rows + engine_speed_rows()


HBM_BYTES_PER_SECOND = {"H100": 3.35e12, "H200": 4.8e12, "A100": 2.0e12}  # vendors' sheets


def engine_speed_rows() -> list[Row]:
    """SmolLM2's decode tokens/s, eager and compiled (CUDA graphs per batch bucket), against
    the HBM roofline: B tokens per read of the fp32 weights."""
    model = load_model("smollm2").cuda()
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    card = next((v for k, v in HBM_BYTES_PER_SECOND.items()
                 if k in torch.cuda.get_device_name()), None)
    rows = []
    for executor in ("eager", "compiled"):
        llm = LLM(model, num_blocks=4096, executor=executor)
        for batch in (1, 16, 64):
            prompts = [[1 + i, 2, 3, 4] for i in range(batch)]
            params = SamplingParams(max_tokens=64)
            llm.generate(prompts, params, progress=False)  # warm-up (and compilation)
            seconds = median_seconds(lambda: llm.generate(prompts, params, progress=False),  # noqa: B023
                                     repeats=3)
            roofline = f", roofline {batch * card / weight_bytes:.0f}" if card else ""
            rows.append(Row(f"speed engine {executor}", f"SmolLM2 fp32 B={batch}", "ok",
                            f"{batch * 64 / seconds:.0f} tokens/s{roofline}"))
    return rows


def print_table(rows: list[Row]) -> None:
    widths = [max(len(getattr(r, f)) for r in rows) for f in ("check", "case", "result")]
    for row in rows:
        cells = (row.check, row.case, row.result)
        print("  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)), row.detail)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="gpu_check.json", help="the table as JSON")
    parser.add_argument("--smollm2", action="store_true",
                        help="also compare the engine on SmolLM2 (default on CUDA)")
    args = parser.parse_args()
    device = torch.cuda.get_device_name() if CUDA else "CPU (Triton interpreter)"
    print(f"gpu-check on {device}, torch {torch.__version__}", flush=True)
    generator = torch.Generator().manual_seed(0)
    rows = flash_rows(generator) + paged_rows(generator) + w4a16_rows(generator)
    with tempfile.TemporaryDirectory() as directory:
        rows += engine_rows(tiny_pair(directory)[0], "tiny model")
    if CUDA or args.smollm2:
        rows += engine_rows(load_model("smollm2"), "SmolLM2")
    rows += tensor_parallel_rows()
    rows += speed_rows()
    print_table(rows)
    with open(args.out, "w") as file:
        json.dump({"device": device, "torch": torch.__version__,
                   "rows": [asdict(r) for r in rows]}, file, indent=1)
    failed = [r for r in rows if r.result == "FAIL"]
    print(f"{len(failed)} wrong of {len(rows)} rows; table written to {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
