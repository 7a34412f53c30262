"""Key/value caches: remember each layer's K and V so decode computes one token, not all.

During generation the keys and values of past tokens never change (a token's K and V
depend only on the tokens before it), so we compute them once and keep them. Queries
are not cached: only the newest token asks a question.

Both caches share one interface, used by :class:`minillm.model.Transformer`:

* ``key_steps(n_new)``: the time step of every key the next forward will attend to
  (-1 for an empty slot), so the model can build the attention mask once per forward;
* ``update(layer, k, v)``: store the new tokens' K/V for one layer and return all keys and
  values to attend to, in the order given by ``key_steps``;
* ``advance(n_new)``: after all layers ran, count the new tokens as stored.

A *time step* is a column of the batch: with left padding it is not a token position.
"""

from __future__ import annotations

import torch

from .config import ModelConfig


class KVCache:
    """Contiguous, preallocated cache: [layers, batch, kv_heads, max_len, head_dim] for K and V.

    Memory is 2 * layers * kv_heads * head_dim * max_len * batch * bytes_per_value.
    Allocating it once avoids growing tensors (and copying them) at every step.
    """

    window: int | None = None  # attends to every past token

    def __init__(self, config: ModelConfig, batch_size: int, max_len: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        shape = (config.num_layers, batch_size, config.num_kv_heads, max_len, config.head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.max_len = max_len
        self.length = 0

    def key_steps(self, n_new: int) -> torch.Tensor:
        if self.length + n_new > self.max_len:
            raise ValueError(
                f"the KV cache holds {self.max_len} steps; {self.length} are used and "
                f"{n_new} more do not fit. Allocate a larger cache (max_len)."
            )
        return torch.arange(self.length + n_new, device=self.keys.device)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        end = self.length + k.shape[2]
        self.keys[layer, :, :, self.length:end] = k
        self.values[layer, :, :, self.length:end] = v
        return self.keys[layer, :, :, :end], self.values[layer, :, :, :end]

    def advance(self, n_new: int) -> None:
        self.length += n_new

    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes


class SlidingWindowKVCache:
    """Keeps only the last ``window`` steps, in a ring buffer (as in Mistral 7B).

    Memory stays constant however long the generation runs; the price is that a token
    can no longer attend further back than ``window`` steps. Keys are stored already
    rotated by RoPE, so their order in the ring does not matter: the mask, built from
    ``key_steps``, decides who sees whom.
    """

    def __init__(self, config: ModelConfig, batch_size: int, window: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        if window < 1:
            raise ValueError(f"window must be at least 1, got {window}")
        shape = (config.num_layers, batch_size, config.num_kv_heads, window, config.head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.slot_steps = torch.full((window,), -1, dtype=torch.long, device=device)
        self.window = window
        self.length = 0

    def _new_steps(self, n_new: int) -> torch.Tensor:
        return torch.arange(self.length, self.length + n_new, device=self.keys.device)

    def key_steps(self, n_new: int) -> torch.Tensor:
        """The ring's slots first, then the new tokens (which attend to each other too)."""
        return torch.cat([self.slot_steps, self._new_steps(n_new)])

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        keys = torch.cat([self.keys[layer], k], dim=2)
        values = torch.cat([self.values[layer], v], dim=2)
        kept = min(k.shape[2], self.window)  # a long prefill keeps only its last `window` steps
        slots = self._new_steps(k.shape[2])[-kept:] % self.window
        self.keys[layer][:, :, slots] = k[:, :, -kept:]
        self.values[layer][:, :, slots] = v[:, :, -kept:]
        return keys, values

    def advance(self, n_new: int) -> None:
        steps = self._new_steps(n_new)[-self.window:]
        self.slot_steps[steps % self.window] = steps
        self.length += n_new

    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes


def kv_cache_bytes(config: ModelConfig, num_tokens: int, batch_size: int = 1,
                   bytes_per_value: int = 2) -> int:
    """Size of a full KV cache: 2 (K and V) x layers x kv_heads x head_dim x tokens x batch."""
    return (2 * config.num_layers * config.num_kv_heads * config.head_dim
            * num_tokens * batch_size * bytes_per_value)
