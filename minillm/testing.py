"""Tiny random models for tests, exercises' graders and experiments.

A tiny Llama runs a forward pass in milliseconds, so every path of the library (the
engine's policies, caches, executors, parallel ranks) can be compared token for token on
it. Two kinds:

* :func:`tiny_pair`: a minillm model and a Hugging Face ``LlamaForCausalLM`` with the same
  random weights, the second saved and loaded back as a checkpoint (the parity oracle);
* :func:`varied_random_model`: a minillm model whose weights are large enough that its
  greedy tokens vary (a default initialisation predicts nearly the same token everywhere,
  which would let a wrong cache or scheduler pass an equality test).

And :func:`watch_copies`, which lets a test see every copy a function makes of its inputs.
"""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_leaves

from .checkpoint import load_model, resolve_checkpoint, save_model
from .config import ModelConfig
from .model import Transformer
from .quant.checkpoint import copy_tokenizer_files

TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
            num_kv_heads=2, head_dim=16, max_position_embeddings=128, rms_norm_eps=1e-5,
            rope_theta=10000.0, tie_word_embeddings=False)


def make_hf_llama(config: ModelConfig, seed: int = 0):
    """A randomly initialised transformers LlamaForCausalLM in fp32 for this config."""
    from transformers import LlamaConfig, LlamaForCausalLM  # heavy: only for parity models

    torch.manual_seed(seed)
    hf_config = LlamaConfig(**config.to_hf())
    model = LlamaForCausalLM(hf_config).float().eval()
    with torch.no_grad():  # norms start at 1.0; perturb them so a wrong mapping would show
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(0.1 * torch.randn_like(param))
    return model


def tiny_pair(directory, seed: int = 0, **overrides) -> tuple[Transformer, torch.nn.Module]:
    """(minillm model, HF model) with identical weights, going through a checkpoint saved in
    ``directory``; ``overrides`` change fields of :data:`TINY`."""
    config = ModelConfig(**{**TINY, **overrides})
    hf = make_hf_llama(config, seed)
    hf.save_pretrained(directory)
    return load_model(directory), hf


def varied_random_model(config: ModelConfig, seed: int = 0) -> Transformer:
    """A tiny random model with weights large enough that its greedy tokens vary."""
    torch.manual_seed(seed)
    model = Transformer(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" not in name:
                param.normal_(0, 0.5)
    return model


def saved_varied_model(directory, **overrides) -> str:
    """:func:`varied_random_model` of the :data:`TINY` shape (``overrides`` change its
    fields) saved in ``directory``, with SmolLM2's tokenizer files beside it (the engine,
    the server and the tensor-parallel workers load a checkpoint by path, tokenizer
    included); returns the path."""
    save_model(varied_random_model(ModelConfig(**{**TINY, **overrides})), directory)
    copy_tokenizer_files(resolve_checkpoint("smollm2"), directory)
    return str(directory)


def watch_copies(*tensors: torch.Tensor) -> tuple[list[torch.Tensor], list[int]]:
    """The tensors, wrapped so that every operation on them (or on anything computed from
    them) notes in the returned list the size, in elements, of each result that has memory
    of its own. A view (an index of one block, a reshape) shares their memory and is not
    noted; a gathered copy, or anything computed from one, is. The tests of kernels that
    must not materialise a large intermediate (a gathered KV cache, a full score matrix)
    bound the largest size noted."""
    copies: list[int] = []
    watched_memory = {t.untyped_storage().data_ptr() for t in tensors}

    class Watched(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            out = super().__torch_function__(func, types, args, kwargs or {})
            with torch._C.DisableTorchFunctionSubclass():  # look without being watched
                copies.extend(t.numel() for t in tree_leaves(out)
                              if isinstance(t, torch.Tensor)
                              and t.untyped_storage().data_ptr() not in watched_memory)
            return out

    return [t.as_subclass(Watched) for t in tensors], copies
