"""Bytes per token across architectures, computed from the released configs.

    python benchmarks/family_costs.py [--contexts 4096 32768] [--bytes-per-value 2]

For each model of :mod:`minillm.published_configs` (and SmolLM2, the course model): the
numbers one layer caches per token, the KV bytes of one sequence at each context (sliding
windows counted: a windowed layer keeps at most its window), the total and the per-token
active parameters, and the weight bytes a decode step reads per token at batch 1 (the
active weights, less an untied embedding table, of which a lookup reads one row). All of
it follows from the configs (no model is loaded); bf16 (2 bytes) unless told otherwise.
"""

from __future__ import annotations

import argparse

from minillm.architecture_costs import kv_bytes, kv_numbers_per_token, parameter_counts
from minillm.config import ModelConfig
from minillm.published_configs import PUBLISHED_CONFIGS


def course_model_config() -> dict:
    """SmolLM2-135M's fields in the Hugging Face layout (from minillm's defaults)."""
    return {**ModelConfig().to_hf(), "model_type": "llama"}


def rows(contexts: list[int], bytes_per_value: int) -> list[list[str]]:
    table = []
    for name, hf in {"SmolLM2-135M": course_model_config(), **PUBLISHED_CONFIGS}.items():
        counts = parameter_counts(hf)
        per_layer = kv_numbers_per_token(hf)
        table.append([name, str(hf["num_hidden_layers"]), f"{per_layer:,}",
                      *(f"{kv_bytes(hf, c, bytes_per_value) / 2**20:,.0f}" for c in contexts),
                      f"{counts.total / 1e9:,.2f}", f"{counts.active / 1e9:,.2f}",
                      f"{counts.read_per_token * bytes_per_value / 2**30:,.2f}"])
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[4096, 32768])
    parser.add_argument("--bytes-per-value", type=int, default=2)
    args = parser.parse_args()
    header = ["model", "layers", "KV numbers/token/layer",
              *(f"KV MiB at {c:,}" for c in args.contexts), "params (B)", "active (B)",
              "weights read/token (GiB)"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows(args.contexts, args.bytes_per_value):
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
