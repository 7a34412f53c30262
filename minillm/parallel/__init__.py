"""Parallelism on torch.distributed (chapter 14): tensor parallelism so far."""

from .tensor import COLLECTIVES, tensor_parallel

__all__ = ["COLLECTIVES", "tensor_parallel"]
