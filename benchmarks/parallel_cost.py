"""Tensor parallelism's communication arithmetic: bytes, decode-step times, where it stops paying.

    python benchmarks/parallel_cost.py                     # H100, batch 1 and 8
    python benchmarks/parallel_cost.py --accelerator A100 --batch 1 32

Pure arithmetic from :mod:`minillm.parallel.cost` (nothing is run or measured; instant):

1. bytes each rank sends per token under tensor parallelism (Megatron: two all-reduces
   of an h-vector per block), and whether the rank's share of the weights fits;
2. for each batch, a decode step on each link: one all-reduce of the step's b x h message,
   every collective of the step, the rank's share of the weight reads, the step, and its
   speedup over one GPU (``*``: Llama-2-70B does not fit in one 80 GB GPU, so that
   baseline is hypothetical);
3. the first TP size whose step is not faster than the previous one's (among those the
   model fits in);
4. one node of 8 GPUs as data-parallel replicas of tensor-parallel groups: time per token
   and total tokens/s.

Link latencies are round assumptions (see ``Interconnect`` in minillm/parallel/catalogue.py):
NVLink 1 µs, PCIe 5 µs, 100 GbE 25 µs, 10 GbE 50 µs per ring step (TCP for Ethernet).
"""

from __future__ import annotations

import argparse

from minillm.parallel.cost import (
    ACCELERATORS,
    ETHERNET_10G,
    ETHERNET_100G,
    LLAMA2_7B,
    LLAMA2_70B,
    MODELS,
    NVLINK3,
    NVLINK4,
    PCIE4,
    communication_table,
    decode_time,
    min_world_to_fit,
    throughput,
    tp_stops_paying,
    weights_per_gpu,
)

SHAPES = (LLAMA2_7B, LLAMA2_70B)
WORLDS = (1, 2, 4, 8)


def links_for(accelerator):
    """The GPU's own NVLink generation, then PCIe and Ethernet."""
    nvlink = NVLINK3 if accelerator.name == "A100" else NVLINK4
    return (nvlink, PCIE4, ETHERNET_100G, ETHERNET_10G)


def bytes_table(accelerator) -> None:
    gb = accelerator.memory_bytes / 1e9
    print(f"Bytes each rank sends per token (fp16); weights per GPU (fits: in {gb:.0f} GB)\n")
    print("| model | TP | per block, B | L blocks, KB | embed + logits, KB | GB/GPU | fits |")
    print("|---|---:|---:|---:|---:|---:|---|")
    rows = communication_table(SHAPES, WORLDS, links_for(accelerator)[:1], accelerator)
    for row in rows:
        print(f"| {row.model} | {row.world} | {row.layer_bytes:,.0f} | "
              f"{row.model_bytes / 1e3:,.1f} | {row.vocab_bytes / 1e3:.1f} | "
              f"{weights_per_gpu(MODELS[row.model], row.world) / 1e9:.1f} | "
              f"{'yes' if row.fits else 'no'} |")


def time_table(accelerator, batch: int) -> None:
    print(f"\nDecode step, {accelerator.name}, batch {batch}: ms (all-reduce: µs); "
          "* = vs a hypothetical 1 GPU\n")
    print("| model | link | TP | all-reduce µs | comm | weights | step | speedup |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for row in communication_table(SHAPES, WORLDS, links_for(accelerator), accelerator, batch):
        one_fits = weights_per_gpu(MODELS[row.model], 1) <= accelerator.memory_bytes
        star = "" if one_fits else "*"
        print(f"| {row.model} | {row.link or '-'} | {row.world} | "
              f"{row.all_reduce_seconds * 1e6:.1f} | {row.communication_seconds * 1e3:.2f} | "
              f"{row.compute_seconds * 1e3:.2f} | {row.step_seconds * 1e3:.2f} | "
              f"{row.speedup:.2f}x{star} |")


def stops_paying_table(accelerator, batches) -> None:
    worlds = (1, 2, 4, 8, 16)
    print(f"\nFirst TP size not faster than the one before ({accelerator.name}, TP "
          f"{worlds[0]}-{worlds[-1]}; - = never)\n")
    print("| model | link | " + " | ".join(f"batch {b}" for b in batches) + " |")
    print("|---|---|" + "---:|" * len(batches))
    for shape in SHAPES:
        for link in links_for(accelerator):
            cells = [tp_stops_paying(shape, link, accelerator, b, worlds) for b in batches]
            print(f"| {shape.name} | {link.name} | "
                  + " | ".join(str(c) if c else "-" for c in cells) + " |")


def placement_table(accelerator, gpus: int, batch: int) -> None:
    print(f"\n{gpus} x {accelerator.name}, batch {batch} per replica: data-parallel replicas "
          "of TP groups\n")
    print("| model | link | replicas x TP | ms per token | tokens/s |")
    print("|---|---|---|---:|---:|")
    for shape in SHAPES:
        for link in links_for(accelerator)[:2]:
            world = 1
            while world <= gpus:
                if world >= min_world_to_fit(shape, accelerator.memory_bytes):
                    step = decode_time(shape, world, link, accelerator, batch)
                    tokens = throughput(shape, gpus, world, link, accelerator, batch)
                    print(f"| {shape.name} | {link.name} | {gpus // world} x {world} | "
                          f"{step * 1e3:.2f} | {tokens:,.0f} |")
                world *= 2


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accelerator", choices=sorted(ACCELERATORS), default="H100")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--gpus", type=int, default=8, help="GPUs of the placement table")
    args = parser.parse_args(argv)
    accelerator = ACCELERATORS[args.accelerator]
    bytes_table(accelerator)
    for batch in args.batch:
        time_table(accelerator, batch)
    stops_paying_table(accelerator, args.batch)
    placement_table(accelerator, args.gpus, args.batch[0])


if __name__ == "__main__":
    main()
