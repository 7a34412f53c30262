"""What chapter 12's graded engine tests share (``test_ch12_paged_kv_cache.py`` and
``test_ch12_paged_attention.py``): a tiny random model whose prompts share six blocks of a
system prompt, so prefix caching, forks and part-full blocks all happen. Not a test file:
the graded files import it."""

from __future__ import annotations

from minillm.config import ModelConfig
from minillm.sampling import SamplingParams

CONFIG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                     num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=128)
SYSTEM = list(range(10, 34))  # six blocks of 4 shared by the prompts
PROMPTS = [SYSTEM + [1, 2, 3], SYSTEM + [4, 5], [40, 41, 42, 43, 44], SYSTEM + [6] * 7]
PARAMS = SamplingParams(max_tokens=8)
