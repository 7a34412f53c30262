"""The ``config.json`` fields that set the cost of five released decoders (declared, copied
from their Hugging Face hub repositories; only the fields :mod:`minillm.architecture_costs`
reads). Chapter 18 compares their KV bytes and active parameters; the tests check the
counts against the published totals."""

from __future__ import annotations

LLAMA_2_7B = dict(  # meta-llama/Llama-2-7b-hf: plain multi-head attention
    model_type="llama", vocab_size=32000, hidden_size=4096, intermediate_size=11008,
    num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32)

MISTRAL_7B = dict(  # mistralai/Mistral-7B-v0.1: GQA and a 4,096-token sliding window
    model_type="mistral", vocab_size=32000, hidden_size=4096, intermediate_size=14336,
    num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, sliding_window=4096)

GEMMA_3_270M = dict(  # google/gemma-3-270m: 5 local (512-token window) layers per global one
    model_type="gemma3_text", vocab_size=262144, hidden_size=640, intermediate_size=2048,
    num_hidden_layers=18, num_attention_heads=4, num_key_value_heads=1, head_dim=256,
    sliding_window=512, tie_word_embeddings=True,
    layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                 for i in range(18)])

QWEN3_30B_A3B = dict(  # Qwen/Qwen3-30B-A3B: 128 experts, 8 active, QK-norm
    model_type="qwen3_moe", vocab_size=151936, hidden_size=2048, intermediate_size=6144,
    moe_intermediate_size=768, num_hidden_layers=48, num_attention_heads=32,
    num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
    decoder_sparse_step=1, mlp_only_layers=[])

DEEPSEEK_V3 = dict(  # deepseek-ai/DeepSeek-V3: MLA, 256 routed experts + 1 shared, 8 active
    model_type="deepseek_v3", vocab_size=129280, hidden_size=7168, intermediate_size=18432,
    moe_intermediate_size=2048, num_hidden_layers=61, num_attention_heads=128,
    q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
    v_head_dim=128, n_routed_experts=256, n_shared_experts=1, num_experts_per_tok=8,
    first_k_dense_replace=3)

PUBLISHED_CONFIGS = {"Llama-2-7B": LLAMA_2_7B, "Mistral-7B": MISTRAL_7B,
                     "Gemma-3-270M": GEMMA_3_270M, "Qwen3-30B-A3B": QWEN3_30B_A3B,
                     "DeepSeek-V3": DEEPSEEK_V3}
