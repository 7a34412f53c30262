"""The ``minillm`` command: fetch the course assets, generate text, measure perplexity, bench.

    minillm fetch                       # SmolLM2 + corpora into $MINILLM_HOME (once)
    minillm generate "Once upon a time" --max-new-tokens 40
    minillm generate "What is a KV cache?" --chat --temperature 0.7 --top-p 0.9 --stream
    minillm perplexity --corpus wikipedia --window 512
    minillm quantize out/smollm2-gptq4 --method gptq --bits 4 --group-size 128
    minillm generate "Hello" --model out/smollm2-gptq4
    minillm distill out/draft-4l --layers 0,10,20,29 --steps 2000   # a speculative draft
    minillm bench                       # quick decode-speed table (benchmarks/decode.py has more)
    minillm grade 3                     # score your chapter-3 exercises
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time

from .assets import AssetError
from .grading import check_impl
from .grading.grade import GradingError
from .serve.executors import EXECUTORS


def cmd_fetch(args) -> None:
    from .assets import fetch_course_model
    from .data import CORPORA, fetch_corpus

    print(f"course model: {fetch_course_model(force=args.force)}")
    for name in CORPORA:
        print(f"corpus {name}: {fetch_corpus(name)}")


def _load(args):
    """The model (int8/int4 checkpoints in the weight-only decode layout) and its tokenizer."""
    from .checkpoint import load_model
    from .quant.weight_only import to_weight_only
    from .tokenizer import Tokenizer

    model = load_model(args.model, attn_backend=args.backend)
    if args.int8_activations:
        _use_int8_activations(model, args.model)
    return to_weight_only(model), Tokenizer(args.model)


def _use_int8_activations(model, source: str) -> None:
    """--int8-activations: run every per-channel int8 linear on int8 activations (W8A8), and
    every grouped int4 one (W4A8)."""
    from .quant.int8_activations import Int8ActivationLinear, to_int8_activations
    from .quant.w4a8 import W4A8Linear

    to_int8_activations(model)
    if not any(isinstance(m, (Int8ActivationLinear, W4A8Linear)) for m in model.modules()):
        raise ValueError(f"--int8-activations needs per-channel int8 weights (or grouped int4), "
                         f"and {source} has none; make them with: minillm quantize OUT "
                         "--method rtn --bits 8 --group-size 0 --symmetric --embedding int8")


def _check_generate_options(args) -> None:
    """Bad options are reported before anything is loaded or printed."""
    if not args.prompt.strip():
        raise ValueError("the prompt is empty; give some text to continue "
                         "(or a question, with --chat)")
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    if args.window is not None and args.window < 1:
        raise ValueError(f"--window must be at least 1, got {args.window}")


def _token_stream(args, model, tokenizer, prompt: list[int]):
    """The new tokens, one [1] tensor per step: the engine, or with --no-cache or --window
    the course's dense loop (:mod:`minillm.reference`), which alone has those caches."""
    from .sampling import SamplingParams

    sampling = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                              repetition_penalty=args.repetition_penalty, seed=args.seed)
    if args.no_cache or args.window is not None:
        from .reference import generate_tokens

        return generate_tokens(model, prompt, args.max_new_tokens, sampling,
                               use_cache=not args.no_cache, window=args.window,
                               stop_tokens=tokenizer.stop_tokens, pad_id=tokenizer.pad_id)
    from .generate import generate_tokens

    return generate_tokens(model, prompt, args.max_new_tokens, sampling,
                           stop_tokens=tokenizer.stop_tokens, pad_id=tokenizer.pad_id,
                           executor=_executor(args, model))


def _executor(args, model) -> str:
    """--executor, with auto resolved to the executor it picks for ``model``."""
    from .serve.executors import auto_executor

    return auto_executor(model) if args.executor == "auto" else args.executor


def cmd_generate(args) -> None:
    from .assets import minillm_home

    _check_generate_options(args)
    # Inductor's compiled steps go to minillm's home; set before anything imports Inductor,
    # which fixes its cache directory on import (transformers' tokenizer loading does).
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(minillm_home() / "inductor"))
    model, tokenizer = _load(args)
    prompt = tokenizer.chat_prompt(args.prompt) if args.chat else tokenizer.encode(args.prompt)
    room = model.config.max_position_embeddings - len(prompt)
    if args.max_new_tokens > room:
        raise ValueError(f"the prompt takes {len(prompt)} of the model's "
                         f"{model.config.max_position_embeddings} tokens of context; "
                         f"use --max-new-tokens {max(room, 0)} or less")
    stream = _token_stream(args, model, tokenizer, prompt)
    first = next(stream)  # any error of the request comes before the prompt is printed
    if not args.chat:
        print(args.prompt, end="", flush=True)
    new_tokens: list[int] = []
    printed = ""
    step_started = time.perf_counter()
    for token in itertools.chain([first], stream):
        if len(new_tokens) == 1:  # the first decode step, which compiles when compiling
            first_step = time.perf_counter() - step_started
        if token.item() in tokenizer.stop_tokens:
            break
        new_tokens.append(token.item())
        if args.stream:  # decode everything so far: a token can be part of a multi-byte char
            text = tokenizer.decode(new_tokens)
            print(text[len(printed):], end="", flush=True)
            printed = text
    if not args.stream:
        print(tokenizer.decode(new_tokens), end="")
    print()
    compiled = not (args.no_cache or args.window) and _executor(args, model) == "compiled"
    if compiled and len(new_tokens) > 1:
        print(f"(decode step compiled in {first_step:.0f} s; Inductor caches it in "
              f"{os.environ['TORCHINDUCTOR_CACHE_DIR']})", file=sys.stderr)


def cmd_perplexity(args) -> None:
    from .data import load_text
    from .eval import perplexity

    model, tokenizer = _load(args)
    tokens = tokenizer.encode(load_text(args.corpus, args.split))
    result = perplexity(model, tokens, window=args.window, stride=args.stride,
                        max_windows=args.max_windows)
    print(f"{args.corpus}/{args.split}: perplexity {result.perplexity:.3f} "
          f"({result.num_tokens} tokens scored in {result.num_windows} windows of {args.window})")


def _quant_scheme(args):
    """The QuantScheme the options ask for (None for sparse24 without --bits: fp16 values)."""
    from .quant import QUANTIZERS, QuantScheme

    needs = QUANTIZERS[args.method].scheme
    if needs == "none" or (needs == "optional" and args.bits is None):
        return None
    return QuantScheme(bits=args.bits or 4, symmetric=args.symmetric,
                       group_size=args.group_size or None)


def _method_options(args) -> dict:
    """The chosen method's own options from the command line."""
    return {"gptq": {"damp": args.damp, "act_order": args.act_order},
            "nf4": {"block_size": args.block_size},
            "llm_int8": {"threshold": args.threshold},
            "sparse24": {"prune": args.prune}}.get(args.method, {})


def cmd_quantize(args) -> None:
    from .checkpoint import load_model, resolve_checkpoint
    from .quant import QUANTIZERS, quantize_model
    from .quant.checkpoint import save_quantized

    scheme = _quant_scheme(args)
    options = _method_options(args)
    windows = None
    needs_windows = (QUANTIZERS[args.method].windows == "required"
                     or options.get("prune") == "wanda")
    model = load_model(args.model)
    if needs_windows:
        from .quant.calibration import calibration_windows
        from .tokenizer import Tokenizer

        windows = calibration_windows(Tokenizer(args.model), args.calib_windows, args.calib_len,
                                      corpus=args.calib_corpus)
    quantize_model(model, args.method, scheme, windows=windows, progress=True, **options)
    if args.embedding != "fp32":
        from .quant.embedding import compact_embedding

        compact_embedding(model, args.embedding)
    out = save_quantized(model, args.out, tokenizer_from=resolve_checkpoint(args.model))
    described = f"{args.method}" + (f" {scheme.bits}-bit, group {scheme.group_size}"
                                     if scheme else "")
    print(f"{described}: wrote {out} (try: minillm generate --model {out} \"Hello\")")


def cmd_distill(args) -> None:
    """Distil a layer-dropped draft of the teacher on corpus text (chapter 10) and save it as
    a checkpoint; report held-out greedy agreement before and after."""
    import json
    from dataclasses import asdict
    from pathlib import Path

    import torch

    from .checkpoint import load_model, resolve_checkpoint, save_model
    from .distill import DistillConfig, distill, teacher_targets, top1_agreement
    from .draft import layer_dropped
    from .quant.calibration import calibration_windows
    from .quant.checkpoint import copy_tokenizer_files
    from .tokenizer import Tokenizer

    torch.manual_seed(args.seed)
    teacher, tokenizer = load_model(args.teacher).eval(), Tokenizer(args.teacher)
    keep = [int(i) for i in args.layers.split(",")]
    student = layer_dropped(teacher, keep)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    targets_file = out / "teacher_targets.pt"  # the teacher runs once, even across resumes
    if targets_file.exists():
        data = torch.load(targets_file, weights_only=False)
    else:
        windows = calibration_windows(tokenizer, args.windows, args.seq_len, args.corpus,
                                      args.seed)
        data = teacher_targets(teacher, windows, k=args.top_k)
        torch.save(data, targets_file)
    held_out = calibration_windows(tokenizer, args.eval_windows, args.seq_len, args.corpus,
                                   args.seed, split="eval")
    best = teacher_targets(teacher, held_out, k=1, progress=False).indices
    before = top1_agreement(layer_dropped(teacher, keep), best, held_out)
    config = DistillConfig(steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                           alpha=args.alpha, temperature=args.temperature, kind=args.kind,
                           seed=args.seed)
    start = time.perf_counter()
    losses = distill(student, data, config, resume_file=out / "distill_state.pt")
    after = top1_agreement(student, best, held_out)
    save_model(student, out)
    copy_tokenizer_files(resolve_checkpoint(args.teacher), out)
    report = {"layers": keep, **asdict(config), "train_tokens": args.steps * args.batch_size
              * (args.seq_len - 1), "held_out_agreement_before": before,
              "held_out_agreement_after": after, "final_loss": losses[-1] if losses else None,
              "seconds_this_run": time.perf_counter() - start}
    (out / "distill_report.json").write_text(json.dumps(report, indent=2))
    print(f"held-out greedy agreement with the teacher ({args.corpus} eval split): "
          f"{before:.3f} -> {after:.3f}; wrote {out} (try: minillm generate --model {out} "
          "\"Hello\")")


def cmd_bench(args) -> None:
    from .bench import run_decode_benchmark

    run_decode_benchmark(threads=args.threads, new_tokens=args.new_tokens, uncached_tokens=0,
                         batches=(1,), compiled=False, quantized=False)


def cmd_grade(args) -> None:
    from .grading.grade import check_honesty, check_mutants, run_graded_tests, score_table

    if args.check_honesty:
        sys.exit(check_honesty(workers=args.workers))
    if args.check_mutants:
        sys.exit(check_mutants(args.chapter, args.workers, args.timeout or 20))
    results = run_graded_tests(args.chapter, args.impl, args.timeout or 60, args.workers)
    print(f"graded: {args.impl}" + (f", chapter {args.chapter}" if args.chapter else ""))
    print(score_table(results))


def _serving_model(args):
    """The engine's model: the checkpoint's name (each process of a tensor-parallel group
    loads its shard), or the loaded model with int8 activations."""
    if not args.int8_activations:
        return args.model
    if args.tensor_parallel > 1:
        raise ValueError("--int8-activations runs in one process; drop --tensor-parallel")
    from .checkpoint import load_model

    model = load_model(args.model)
    _use_int8_activations(model, args.model)
    return model


def cmd_serve(args) -> int:
    import uvicorn

    from .serve import LLM, SchedulerConfig
    from .serve.server import create_app
    from .tokenizer import Tokenizer

    scheduler = SchedulerConfig(max_batch=args.max_batch,
                                speculative_tokens=args.speculative_tokens)
    llm = LLM(_serving_model(args), num_blocks=args.num_blocks, scheduler=scheduler,
              tensor_parallel_size=args.tensor_parallel,
              shard_attention=not args.replicate_attention, tokenizer=Tokenizer(args.model),
              worker_timeout=args.worker_timeout, executor=args.executor,
              draft_model=args.draft_model)
    stopped: list[str] = []

    def engine_stopped(reason: str) -> None:  # serve nothing rather than hang: exit, 1
        print(f"minillm serve: the engine stopped: {reason}", file=sys.stderr)
        stopped.append(reason)
        server.should_exit = True

    app = create_app(llm, args.served_name or args.model, on_engine_stop=engine_stopped,
                     api_key=args.api_key or os.environ.get("MINILLM_API_KEY"))
    # SIGTERM/Ctrl-C: open streams get a few seconds to finish, then the server exits even
    # if a step is stuck (the engine's step thread is a daemon).
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port,
                                           log_level="warning", timeout_graceful_shutdown=3))
    try:
        server.run()
    finally:
        llm.close()
    return 1 if stopped else 0


def build_parser() -> argparse.ArgumentParser:
    from .quant import QUANTIZERS

    parser = argparse.ArgumentParser(prog="minillm", description="LLM inference from the ground up")
    sub = parser.add_subparsers(dest="command", required=True)

    fetch = sub.add_parser("fetch", help="prepare the course model and text corpora (once)")
    fetch.add_argument("--force", action="store_true", help="convert the model again")
    fetch.set_defaults(func=cmd_fetch)

    def model_options(p):
        p.add_argument("--model", default="smollm2",
                       help="checkpoint dir, hub id, or smollm2 (default)")
        p.add_argument("--backend", default="sdpa", help="attention backend: sdpa, naive, ...")
        p.add_argument("--int8-activations", action="store_true",
                       help="with per-channel int8 weights: round activations to int8 too and "
                            "multiply in integers (W8A8; grouped int4 weights: W4A8), "
                            "slightly less accurate")

    def executor_option(p):
        p.add_argument("--executor", default="auto", choices=EXECUTORS,
                       help="how decode steps are computed: native (C++; float32, W8A8, "
                            "W4A8), compiled (torch.compile per batch bucket: the "
                            "weight-only int8/int4 layouts; the first steps take a minute "
                            "or two to compile), eager, or auto (the fastest the model "
                            "allows)")

    gen = sub.add_parser("generate", help="continue a prompt, or answer it with --chat")
    gen.add_argument("prompt")
    model_options(gen)
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    gen.add_argument("--max-new-tokens", type=int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--repetition-penalty", type=float, default=1.0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--stream", action="store_true", help="print tokens as they come")
    gen.add_argument("--no-cache", action="store_true", help="recompute the prefix every step")
    gen.add_argument("--window", type=int, default=None, help="sliding-window KV cache size")
    executor_option(gen)
    gen.set_defaults(func=cmd_generate)

    ppl = sub.add_parser("perplexity", help="perplexity on a fixed corpus split")
    model_options(ppl)
    ppl.add_argument("--corpus", default="wikipedia")
    ppl.add_argument("--split", default="eval")
    ppl.add_argument("--window", type=int, default=512)
    ppl.add_argument("--stride", type=int, default=None)
    ppl.add_argument("--max-windows", type=int, default=None)
    ppl.set_defaults(func=cmd_perplexity)

    grade = sub.add_parser("grade", help="run the graded tests and print your score")
    grade.add_argument("chapter", nargs="?", default=None, help="e.g. 3 (default: all)")
    grade.add_argument("--impl", default="exercises", type=check_impl,
                       help="exercises (default), solutions, or mutant:chNN_topic:name")
    grade.add_argument("--timeout", type=float, default=None,
                       help="seconds per test (default 60; 20 with --check-mutants)")
    grade.add_argument("--workers", type=int, default=None, help="parallel pytest workers")
    grade.add_argument("--check-honesty", action="store_true",
                       help="CI: every test fails on the stubs and passes on the solutions")
    grade.add_argument("--check-mutants", action="store_true",
                       help="CI: every wrong answer in tests/grading/mutants loses points")
    grade.set_defaults(func=cmd_grade)

    quant = sub.add_parser("quantize", help="compress a model's linear layers and save it")
    quant.add_argument("out", help="directory to write (loads with --model OUT)")
    quant.add_argument("--model", default="smollm2", help="checkpoint dir, hub id or smollm2")
    quant.add_argument("--method", default="rtn", choices=list(QUANTIZERS),
                       help=" | ".join(QUANTIZERS))
    quant.add_argument("--bits", type=int, default=None,
                       help="integer grid bits for rtn/gptq/awq (default 4); sparse24: "
                            "quantize the kept values too")
    quant.add_argument("--group-size", type=int, default=128,
                       help="inputs sharing one scale (0: one scale per output channel)")
    quant.add_argument("--symmetric", action="store_true", help="absmax instead of zero-point")
    quant.add_argument("--embedding", default="fp16", choices=("fp32", "fp16", "int8"),
                       help="storage of the token embedding (tied: also the lm_head)")
    quant.add_argument("--calib-windows", type=int, default=128, help="GPTQ/AWQ/Wanda calibration")
    quant.add_argument("--calib-len", type=int, default=512, help="tokens per window")
    quant.add_argument("--calib-corpus", default="sotu")
    quant.add_argument("--damp", type=float, default=0.1,
                       help="GPTQ: Hessian dampening, a fraction of its mean diagonal")
    quant.add_argument("--act-order", action=argparse.BooleanOptionalAction, default=True,
                       help="GPTQ: quantize columns by decreasing Hessian diagonal")
    quant.add_argument("--block-size", type=int, default=64, help="NF4: weights per absmax")
    quant.add_argument("--threshold", type=float, default=6.0,
                       help="LLM.int8: activation magnitude of an outlier feature")
    quant.add_argument("--prune", default="magnitude", choices=("magnitude", "wanda"),
                       help="sparse24: which weights to prune")
    quant.set_defaults(func=cmd_quantize)

    dist = sub.add_parser("distill", help="distil a layer-dropped draft of a model and save it")
    dist.add_argument("out", help="directory to write (loads with load_model(OUT)); a run "
                                  "that finds its state there resumes")
    dist.add_argument("--teacher", default="smollm2", help="checkpoint dir, hub id or smollm2")
    dist.add_argument("--layers", default="0,10,20,29",
                      help="the teacher's blocks the draft keeps, comma-separated")
    dist.add_argument("--corpus", default="wikipedia", help="training text (train split)")
    dist.add_argument("--windows", type=int, default=1024, help="training windows")
    dist.add_argument("--seq-len", type=int, default=256, help="tokens per window")
    dist.add_argument("--eval-windows", type=int, default=32,
                      help="held-out windows (eval split) for the agreement")
    dist.add_argument("--top-k", type=int, default=64, help="teacher logits kept per position")
    dist.add_argument("--steps", type=int, default=1000)
    dist.add_argument("--batch-size", type=int, default=4)
    dist.add_argument("--lr", type=float, default=3e-4)
    dist.add_argument("--alpha", type=float, default=0.9, help="weight of the soft (KD) term")
    dist.add_argument("--temperature", type=float, default=2.0)
    dist.add_argument("--kind", default="forward", choices=("forward", "tv"),
                      help="divergence of the soft term")
    dist.add_argument("--seed", type=int, default=0)
    dist.set_defaults(func=cmd_distill)

    serve = sub.add_parser("serve", help="an OpenAI-compatible HTTP server over the engine")
    serve.add_argument("--model", default="smollm2",
                       help="checkpoint dir (float or `minillm quantize` output), hub id, or "
                            "smollm2 (default)")
    serve.add_argument("--served-name", help="the model name clients ask for (default: --model)")
    serve.add_argument("--host", default="127.0.0.1",
                       help="the address to listen on (default: this machine only; 0.0.0.0 "
                            "serves the network, with --api-key)")
    serve.add_argument("--api-key", default=None,
                       help="require 'Authorization: Bearer KEY' on /v1 (or set "
                            "MINILLM_API_KEY)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--num-blocks", type=int, default=1024, help="KV-cache blocks of 16 tokens")
    serve.add_argument("--max-batch", type=int, default=16, help="sequences per step")
    serve.add_argument("--tensor-parallel", type=int, default=1, metavar="N",
                       help="run the model on N processes (chapter 14)")
    serve.add_argument("--replicate-attention", action="store_true",
                       help="with --tensor-parallel: keep attention whole on every process "
                            "(SmolLM2 on 2 processes)")
    executor_option(serve)
    serve.add_argument("--worker-timeout", type=float, default=60.0, metavar="SECONDS",
                       help="with --tensor-parallel: how long a step may take before the "
                            "workers count as hung and the server stops (exit status 1)")
    serve.add_argument("--draft-model", default=None, metavar="DIR",
                       help="with --speculative-tokens: a smaller model guesses instead of "
                            "prompt lookup (e.g. one made by minillm distill)")
    serve.add_argument("--speculative-tokens", type=int, default=0, metavar="K",
                       help="prompt-lookup guesses per decode step (chapter 11; 0: off)")
    serve.add_argument("--int8-activations", action="store_true",
                       help="with per-channel int8 weights (or grouped int4): round activations "
                            "to int8 too (W8A8/W4A8, chapter 6; the capstone's fastest engine)")
    serve.set_defaults(func=cmd_serve)

    bench = sub.add_parser("bench", help="quick decode-speed comparison with Hugging Face")
    bench.add_argument("--threads", type=int, default=2)
    bench.add_argument("--new-tokens", type=int, default=32)
    bench.set_defaults(func=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except (ValueError, AssetError, GradingError) as error:
        print(f"minillm {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
