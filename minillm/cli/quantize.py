"""``minillm quantize OUT``: compress a model's linear layers and save the checkpoint."""

from __future__ import annotations

import argparse

from ..checkpoint import load_model, resolve_checkpoint
from ..quant import QUANTIZERS, QuantScheme, quantize_model
from ..quant.calibration import calibration_windows
from ..quant.checkpoint import save_quantized
from ..quant.embedding import compact_embedding
from ..tokenizer import Tokenizer


def add_arguments(parser) -> None:
    parser.add_argument("out", help="directory to write (loads with --model OUT)")
    parser.add_argument("--model", default="smollm2", help="checkpoint dir, hub id or smollm2")
    parser.add_argument("--method", default="rtn", choices=list(QUANTIZERS),
                        help=" | ".join(QUANTIZERS))
    parser.add_argument("--bits", type=int, default=None,
                        help="integer grid bits for rtn/gptq/awq (default 4); sparse24: "
                             "quantize the kept values too")
    parser.add_argument("--group-size", type=int, default=128,
                        help="inputs sharing one scale (0: one scale per output channel)")
    parser.add_argument("--symmetric", action="store_true",
                        help="absmax instead of zero-point")
    parser.add_argument("--embedding", default="fp16", choices=("fp32", "fp16", "int8"),
                        help="storage of the token embedding (tied: also the lm_head)")
    parser.add_argument("--calib-windows", type=int, default=128,
                        help="GPTQ/AWQ/Wanda calibration")
    parser.add_argument("--calib-len", type=int, default=512, help="tokens per window")
    parser.add_argument("--calib-corpus", default="sotu")
    parser.add_argument("--damp", type=float, default=0.1,
                        help="GPTQ: Hessian dampening, a fraction of its mean diagonal")
    parser.add_argument("--act-order", action=argparse.BooleanOptionalAction, default=True,
                        help="GPTQ: quantize columns by decreasing Hessian diagonal")
    parser.add_argument("--block-size", type=int, default=64, help="NF4: weights per absmax")
    parser.add_argument("--threshold", type=float, default=6.0,
                        help="LLM.int8: activation magnitude of an outlier feature")
    parser.add_argument("--prune", default="magnitude", choices=("magnitude", "wanda"),
                        help="sparse24: which weights to prune")


def quant_scheme(args):
    """The QuantScheme the options ask for (None for sparse24 without --bits: fp16 values)."""
    needs = QUANTIZERS[args.method].scheme
    if needs == "none" or (needs == "optional" and args.bits is None):
        return None
    return QuantScheme(bits=args.bits or 4, symmetric=args.symmetric,
                       group_size=args.group_size or None)


def method_options(args) -> dict:
    """The chosen method's own options from the command line."""
    return {"gptq": {"damp": args.damp, "act_order": args.act_order},
            "nf4": {"block_size": args.block_size},
            "llm_int8": {"threshold": args.threshold},
            "sparse24": {"prune": args.prune}}.get(args.method, {})


def run(args) -> None:
    scheme = quant_scheme(args)
    options = method_options(args)
    windows = None
    needs_windows = (QUANTIZERS[args.method].windows == "required"
                     or options.get("prune") == "wanda")
    model = load_model(args.model)
    if needs_windows:
        windows = calibration_windows(Tokenizer(args.model), args.calib_windows, args.calib_len,
                                      corpus=args.calib_corpus)
    quantize_model(model, args.method, scheme, windows=windows, progress=True, **options)
    if args.embedding != "fp32":
        compact_embedding(model, args.embedding)
    out = save_quantized(model, args.out, tokenizer_from=resolve_checkpoint(args.model))
    described = f"{args.method}" + (f" {scheme.bits}-bit, group {scheme.group_size}"
                                     if scheme else "")
    print(f"{described}: wrote {out} (try: minillm generate --model {out} \"Hello\")")
