"""minillm: LLM inference from the ground up.

A readable Llama-family inference library, built chapter by chapter in the course.
"""

from .checkpoint import load_model
from .config import ModelConfig
from .generate import generate, generate_tokens
from .kv_cache import KVCache, SlidingWindowKVCache
from .model import Transformer
from .sampling import SamplingParams, sample
from .tokenizer import Tokenizer

__all__ = ["KVCache", "ModelConfig", "SamplingParams", "SlidingWindowKVCache", "Tokenizer",
           "Transformer", "generate", "generate_tokens", "load_model", "sample"]
