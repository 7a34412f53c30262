"""MoE decode in the engine: a small random Qwen3-MoE model against dense Qwen3 models.

    python benchmarks/moe_models.py                        # the recorded table
    python benchmarks/moe_models.py --busy-ok --steps 16   # a smoke run on a busy machine

Three models with the same attention, embeddings and head (Qwen3: QK-norm; fp32, random
weights, built by minillm from Hugging Face config dicts), differing only in the
feed-forward layer of every block:

* MoE: ``--experts`` SwiGLU experts of width ``--expert-width``, top ``--top-k``, softmax
  routing renormalised (Qwen3-MoE), the grouped dispatch of :mod:`minillm.moe`;
* dense-active: one SwiGLU MLP of width k·I: the MoE's active parameters per token;
* dense-total: one SwiGLU MLP of width E·I: all the MoE's parameters.

Each runs in the engine (eager executor: the one MoE models run in), B sequences with
their own 32-token prompts, then ``--steps`` decode steps. Printed per model and batch:
decode tokens/s (the median over ``--repeats`` runs of decode tokens over the decode
steps' seconds, with the range), and the weight bytes a decode step reads per token: every
non-feed-forward weight, once per step, plus the feed-forward weights the step touched
(for the MoE, its routers and the distinct experts its B tokens chose, counted by
:func:`minillm.moe.expert_bytes_read` from the real routing of every step), divided by
B. Timings are only honest on a quiet machine (:func:`minillm.machine.quiet_problem`).
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch

from minillm.config import ModelConfig
from minillm.machine import describe, quiet_problem
from minillm.model import Transformer
from minillm.moe import MoE, expert_bytes_read
from minillm.sampling import SamplingParams
from minillm.serve import LLM

PROMPT_TOKENS = 32


def hf_config(args, kind: str) -> dict:
    """A Hugging Face config dict of the ``kind`` model (moe, dense-active, dense-total)."""
    common = dict(vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
                  num_attention_heads=args.heads, num_key_value_heads=args.heads // 2,
                  head_dim=args.hidden // args.heads, max_position_embeddings=1024,
                  rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=True,
                  torch_dtype="float32")
    if kind == "moe":
        return dict(common, model_type="qwen3_moe", num_experts=args.experts,
                    num_experts_per_tok=args.top_k, moe_intermediate_size=args.expert_width,
                    intermediate_size=args.expert_width, norm_topk_prob=True,
                    decoder_sparse_step=1, mlp_only_layers=[])
    width = args.expert_width * (args.top_k if kind == "dense-active" else args.experts)
    return dict(common, model_type="qwen3", intermediate_size=width)


def random_model(config: dict) -> Transformer:
    torch.manual_seed(0)
    model = Transformer(ModelConfig.from_hf(config)).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" not in name:
                parameter.normal_(0, 0.02)
    return model


def feed_forward_bytes(model: Transformer) -> int:
    return sum(4 * p.numel() for block in model.layers for p in block.mlp.parameters())


class RoutingLog:
    """The weight bytes the MoE layers read in each forward pass, from their routers'
    choices (a hook on each router: nothing is computed twice)."""

    def __init__(self, model: Transformer):
        self.step_bytes: list[int] = []
        layers = [m for m in model.modules() if isinstance(m, MoE)]
        self.last_router = layers[-1].gate
        self.pending = 0
        for layer in layers:
            experts, width = layer.experts.down_proj.shape[0], layer.experts.down_proj.shape[2]
            layer.gate.register_forward_hook(
                lambda router, inputs, output, e=experts, i=width: self._record(
                    router, output[0], e, inputs[0].shape[-1], i))

    def _record(self, router, ids: torch.Tensor, experts: int, hidden: int, width: int):
        self.pending += expert_bytes_read(ids, experts, hidden, width).moe_bytes
        if router is self.last_router:
            self.step_bytes.append(self.pending)
            self.pending = 0


def decode_run(model: Transformer, batch: int, steps: int) -> tuple[float, list[float]]:
    """Decode tokens/s of one run, and the seconds of its decode steps."""
    reports = []
    llm = LLM(model, executor="eager", block_size=16, num_blocks=batch * 8 + 8,
              on_step=reports.append)
    torch.manual_seed(batch)
    prompts = torch.randint(0, model.config.vocab_size, (batch, PROMPT_TOKENS)).tolist()
    llm.generate(prompts, SamplingParams(max_tokens=steps + 1), progress=False)
    decode = [r for r in reports if r.work and all(w.tokens == 1 for w in r.work)]
    return sum(r.num_tokens for r in decode) / sum(r.seconds for r in decode), \
        [r.seconds for r in decode]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--experts", type=int, default=32)
    parser.add_argument("--top-k", type=int, default=4)
    parser.add_argument("--expert-width", type=int, default=256)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--busy-ok", action="store_true")
    args = parser.parse_args(argv)
    problem = quiet_problem()
    if problem and not args.busy_ok:
        sys.exit(f"not timing: {problem} (--busy-ok to run anyway, not for the record)")
    models = {kind: random_model(hf_config(args, kind))
              for kind in ("moe", "dense-active", "dense-total")}
    log = RoutingLog(models["moe"])
    print(f"{describe()}, {torch.get_num_threads()} threads"
          + (f"; BUSY ({problem}): not for the record" if problem else ""))
    print(f"Qwen3 {args.layers} layers, hidden {args.hidden}, vocab {args.vocab}; MoE: "
          f"{args.experts} experts of {args.expert_width}, top {args.top_k}; fp32, eager; "
          f"{args.steps} decode steps, median [range] of {args.repeats} runs")
    print("| model | params (M) | B | decode tokens/s | weight MB read per token |")
    print("|---|---:|---:|---:|---:|")
    for kind, model in models.items():
        params = sum(p.numel() for p in model.parameters())
        shared = 4 * params - feed_forward_bytes(model)  # read once per step, whatever B
        for batch in args.batches:
            log.step_bytes.clear()
            speeds = [decode_run(model, batch, args.steps)[0] for _ in range(args.repeats)]
            if kind == "moe":  # the last run's decode steps (after its prompt step)
                ff = statistics.mean(log.step_bytes[-args.steps:])
            else:
                ff = feed_forward_bytes(model)
            print(f"| {kind} | {params / 1e6:.1f} | {batch} | {statistics.median(speeds):.0f} "
                  f"[{min(speeds):.0f}–{max(speeds):.0f}] | {(shared + ff) / batch / 1e6:.1f} |")


if __name__ == "__main__":
    main()
