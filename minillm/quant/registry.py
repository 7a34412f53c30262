"""Every compression method of chapters 06–09 behind one name.

    from minillm.quant import quantize_model
    quantize_model(model, "rtn", QuantScheme(bits=8, symmetric=True, group_size=None))
    quantize_model(model, "gptq", QuantScheme(bits=4, group_size=128), windows=windows)
    quantize_model(model, "nf4", block_size=64)

| name       | chapter | stores each linear layer as                         | calibration |
|------------|---------|-----------------------------------------------------|-------------|
| rtn        | 06      | integer codes, round to nearest (QuantLinear)       | no          |
| gptq       | 07      | the same, codes chosen with error compensation      | yes         |
| awq        | 08      | the same, after activation-aware scaling            | yes         |
| nf4        | 06      | 4-bit NormalFloat + double-quantized block absmax   | no          |
| llm_int8   | 06      | int8 weights and activations, outliers in float     | no          |
| fp8        | 06      | FP8 E4M3 values + a scale per row                   | no          |
| sparse24   | 09      | 2:4 pruned, compressed, optionally quantized        | Wanda only  |

Each method's own entry point (``quantize_model_rtn``, ``quantize_model_gptq``, ...)
takes the model, the scheme if the method uses an integer grid, and keyword arguments:
``windows`` (calibration tokens) when it needs them, ``skip`` (names of layers to keep in
float, by default the lm_head) and ``progress``, plus its own options. The registry adds
what the command line, the benchmark and the checkpoint loader need to know about it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from ..linear import DEFAULT_SKIP
from .awq import quantize_model_awq
from .basic import QuantScheme
from .fp8 import quantize_model_fp8
from .gptq import quantize_model_gptq
from .llm_int8 import quantize_model_llm_int8
from .nf4 import quantize_model_nf4
from .qlinear import quantize_model_rtn
from .sparsity import quantize_model_sparse24


@dataclass(frozen=True)
class Quantizer:
    """One method: its entry point and how to call it."""

    name: str
    summary: str
    function: Callable[..., nn.Module]
    scheme: str  # "required", "optional" or "none": a QuantScheme as second argument
    windows: str  # "required", "optional" or "none": calibration tokens (keyword)

    def options(self) -> list[str]:
        """The method's own keyword options (what ``**options`` may contain)."""
        common = {"windows", "skip", "progress"}
        return [name for name, p in inspect.signature(self.function).parameters.items()
                if p.kind is p.KEYWORD_ONLY and name not in common]


QUANTIZERS: dict[str, Quantizer] = {q.name: q for q in [
    Quantizer("rtn", "round to nearest on an integer grid", quantize_model_rtn,
              "required", "none"),
    Quantizer("gptq", "GPTQ: second-order error compensation", quantize_model_gptq,
              "required", "required"),
    Quantizer("awq", "AWQ: activation-aware scaling, then RTN", quantize_model_awq,
              "required", "required"),
    Quantizer("nf4", "NF4 with double quantization (QLoRA)", quantize_model_nf4, "none", "none"),
    Quantizer("llm_int8", "LLM.int8(): int8 with outlier features in float",
              quantize_model_llm_int8, "none", "none"),
    Quantizer("fp8", "FP8 E4M3 weights, a scale per row", quantize_model_fp8, "none", "none"),
    Quantizer("sparse24", "2:4 sparsity (Wanda needs windows), compressed, optionally "
              "quantized", quantize_model_sparse24, "optional", "optional"),
]}


def get_quantizer(name: str) -> Quantizer:
    if name not in QUANTIZERS:
        raise ValueError(f"unknown quantization method {name!r}; choose one of "
                         f"{', '.join(QUANTIZERS)}")
    return QUANTIZERS[name]


def quantize_model(model: nn.Module, method: str, scheme: QuantScheme | None = None, *,
                   windows: torch.Tensor | None = None, skip: tuple[str, ...] = DEFAULT_SKIP,
                   progress: bool = False, **options) -> nn.Module:
    """Compress ``model``'s linear layers in place with ``method`` (a name in
    :data:`QUANTIZERS`); ``options`` are the method's own (``damp=0.1``, ``block_size=64``)."""
    quantizer = get_quantizer(method)
    unknown = set(options) - set(quantizer.options())
    if unknown:
        raise ValueError(f"{method} has no option {', '.join(sorted(unknown))}; its options "
                         f"are {', '.join(quantizer.options()) or 'none'}")
    if quantizer.scheme == "required" and scheme is None:
        raise ValueError(f"{method} needs a QuantScheme, e.g. QuantScheme(bits=4, group_size=64)")
    if quantizer.scheme == "none" and scheme is not None:
        raise ValueError(f"{method} has its own number format and takes no QuantScheme")
    if quantizer.windows == "required" and windows is None:
        raise ValueError(f"{method} needs calibration inputs: pass windows="
                         "calibration_windows(tokenizer, 16) from minillm.quant.calibration")
    if quantizer.windows == "none" and windows is not None:
        raise ValueError(f"{method} needs no calibration inputs; drop windows=")
    args = [model] if quantizer.scheme == "none" else [model, scheme]
    if windows is not None:
        options["windows"] = windows
    return quantizer.function(*args, skip=skip, progress=progress, **options)
