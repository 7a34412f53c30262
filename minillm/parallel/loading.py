"""Load one rank's shard of a checkpoint, reading only that shard from the safetensors file.

:func:`~minillm.parallel.tensor.tensor_parallel` cuts a model that is already in memory:
every rank first holds the whole model. For a model larger than one machine's memory
that is impossible, and for any model it wastes t − 1 copies of the reading. A
safetensors file is a header plus raw tensors at known offsets, so a rank can ask for
rows [a, b) or columns [a, b) of one tensor and read just those bytes
(``safe_open(...).get_slice(name)[a:b]``).

:func:`load_shard` builds the rank's model on the meta device (shapes only, no memory),
lets ``tensor_parallel`` give it the sharded shapes (and its parallel layers, which hold
each shard as ``<layer>.shard``), then fills each tensor from its slice of the file.
Which slice is :func:`split_dim`: the same table ``tensor_parallel`` follows
(column-parallel rows, row-parallel columns, vocabulary rows, everything else whole).
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from ..checkpoint import load_model, resolve_checkpoint
from ..config import ModelConfig
from ..model import Transformer
from ..weights import hf_to_minillm_name, load_weights, weight_files
from .tensor import (
    COLUMN_PARALLEL,
    ROW_PARALLEL,
    ParallelLayers,
    ShardWeight,
    shard_weight,
    tensor_parallel,
)


def split_dim(name: str, shard_attention: bool = True) -> int | None:
    """The dimension along which rank shards cut the tensor ``name`` (minillm's name), or
    None when every rank keeps it whole. A row-parallel layer's bias (dim 1 of a 1-D
    tensor) is kept whole by rank 0 and zeroed elsewhere."""
    parts = name.split(".")
    if name.startswith(("embed_tokens.", "lm_head.")):
        return 0
    if len(parts) < 4 or (parts[2] == "attn" and not shard_attention):
        return None
    if parts[3] in COLUMN_PARALLEL:
        return 0
    if parts[3] in ROW_PARALLEL:
        return 1
    return None


def rank_model_name(name: str, shard_attention: bool = True) -> str:
    """The name under which a rank's model holds the tensor ``name`` (minillm's name): a
    sharded linear layer keeps its shard as ``<layer>.shard``."""
    parts = name.split(".")
    if len(parts) >= 5 and parts[3] in COLUMN_PARALLEL + ROW_PARALLEL and \
            split_dim(name, shard_attention) is not None:
        return ".".join([*parts[:4], "shard", *parts[4:]])
    return name


def _read_slice(handle, key: str, dim: int | None, rank: int, world: int) -> torch.Tensor:
    """Only rank ``rank``'s part of tensor ``key``: the bytes read are the shard's."""
    piece = handle.get_slice(key)
    shape = piece.get_shape()
    if dim is None:
        return piece[:]
    if len(shape) == 1 and dim == 1:  # row-parallel bias: added once, by rank 0
        return piece[:] if rank == 0 else torch.zeros_like(piece[:])
    part = shape[dim] // world
    window = slice(rank * part, (rank + 1) * part)
    return piece[window] if dim == 0 else piece[:, window]


def load_shard(name_or_path: str | Path, rank: int, world: int, *,
               shard_attention: bool = True, dtype: torch.dtype = torch.float32
               ) -> Transformer:
    """Rank ``rank``'s model of ``world``, equal to ``tensor_parallel(load_model(...))``
    but reading only its shard of every weight from disk (a mixture-of-experts model's
    checkpoint, which holds each expert apart, is loaded whole and then cut)."""
    directory = resolve_checkpoint(name_or_path)
    config = ModelConfig.from_json(directory / "config.json")
    if config.moe is not None:
        return tensor_parallel(load_model(directory, dtype=dtype), rank, world,
                               shard_attention=shard_attention)
    with torch.device("meta"):
        model = tensor_parallel(Transformer(config), rank, world,
                                shard_attention=shard_attention)
    wanted = set(model.state_dict())
    state = {}
    for file in weight_files(directory):
        with safe_open(file, framework="pt") as handle:
            for key in handle.keys():  # noqa: SIM118 (a safe_open handle is not iterable)
                name = rank_model_name(hf_to_minillm_name(key, config.family), shard_attention)
                if name in wanted:
                    dim = split_dim(hf_to_minillm_name(key, config.family), shard_attention)
                    state[name] = _read_slice(handle, key, dim, rank, world)
    load_weights(model, state, f"checkpoint {directory}", assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    model.build_rope()  # its buffers were on the meta device
    return model.to(dtype=dtype).eval()


def load_rank_model(checkpoint: str | Path, rank: int, world: int, shard_attention: bool,
                    shard: ShardWeight | None, layers: ParallelLayers | None = None
                    ) -> Transformer:
    """This rank's model: read from its shard of the file, or, with a ``shard`` function
    or parallel ``layers`` of your own, cut by them from the whole model."""
    if shard is None and layers is None:
        return load_shard(checkpoint, rank, world, shard_attention=shard_attention)
    return tensor_parallel(load_model(checkpoint), rank, world,
                           shard_attention=shard_attention, shard=shard or shard_weight,
                           layers=layers)
