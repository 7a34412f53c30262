"""Quantization and sparsity: storing weights in fewer bits (course part III).

Every method is reachable by name through :func:`quantize_model` (see :mod:`.registry`).
"""

from .basic import QuantScheme
from .registry import QUANTIZERS, quantize_model

__all__ = ["QUANTIZERS", "QuantScheme", "quantize_model"]
