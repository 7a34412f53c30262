"""Key/value caches: remember each layer's K and V so decode computes one token, not all.

During generation the keys and values of past tokens never change (a token's K and V
depend only on the tokens before it), so we compute them once and keep them. Queries
are not cached: only the newest token asks a question.

These caches share one interface, used by :class:`minillm.model.Transformer`:

* ``steps(n_new)``: the time steps of the new tokens (the queries) and of every key the
  next forward will attend to (-1 for an empty slot), so the model can build the
  attention mask once per forward;
* ``attend(layer, q, k, v, mask, backend)``: store the new tokens' K/V for one layer
  (``update``) and compute the queries' attention over every key they may see — the one
  call a model layer makes, which the serving engine's paged cache
  (:mod:`minillm.engine.paged_cache`) implements too;
* ``advance(n_new)``: after all layers ran, count the new tokens as stored;
* ``rewind(n)`` (contiguous caches): forget the last ``n`` stored steps (speculative
  decoding's rejected tokens).

A *time step* is a column of the batch: with left padding it is not a token position.
"""

from __future__ import annotations

import torch

from .config import ModelConfig


def _allocate(config: ModelConfig, batch_size: int, slots: int, dtype, device):
    """Zeroed K and V buffers: [layers, batch, kv_heads, slots, head_dim] each."""
    shape = (config.num_layers, batch_size, config.num_kv_heads, slots, config.head_dim)
    return (torch.zeros(shape, dtype=dtype, device=device),
            torch.zeros(shape, dtype=dtype, device=device))


class DenseCache:
    """What the contiguous caches share: attention = update, then the backend."""

    keys: torch.Tensor
    values: torch.Tensor

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        raise NotImplementedError

    def attend(self, layer: int, q, k, v, mask, backend) -> torch.Tensor:
        keys, values = self.update(layer, k, v)
        return backend(q, keys, values, mask)

    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes


class KVCache(DenseCache):
    """Contiguous, preallocated cache: [layers, batch, kv_heads, max_len, head_dim] for K and V.

    Memory is 2 * layers * kv_heads * head_dim * max_len * batch * bytes_per_value.
    Allocating it once avoids growing tensors (and copying them) at every step.
    """

    window: int | None = None  # attends to every past token
    decode_needs_mask = False  # a single new token may see every key update() returns

    def __init__(self, config: ModelConfig, batch_size: int, max_len: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        self.keys, self.values = _allocate(config, batch_size, max_len, dtype, device)
        self.max_len = max_len
        self.length = 0

    def steps(self, n_new: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.length + n_new > self.max_len:
            raise ValueError(
                f"the KV cache holds {self.max_len} steps; {self.length} are used and "
                f"{n_new} more do not fit. Allocate a larger cache (max_len)."
            )
        key_steps = torch.arange(self.length + n_new, device=self.keys.device)
        return key_steps[self.length:], key_steps

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        end = self.length + k.shape[2]
        self.keys[layer, :, :, self.length:end] = k
        self.values[layer, :, :, self.length:end] = v
        return self.keys[layer, :, :, :end], self.values[layer, :, :, :end]

    def advance(self, n_new: int) -> None:
        self.length += n_new

    def rewind(self, n: int) -> None:
        if not 0 <= n <= self.length:
            raise ValueError(f"cannot rewind {n} of {self.length} stored steps")
        self.length -= n


class SlidingWindowKVCache(DenseCache):
    """Keeps only the last ``window`` steps, in a ring buffer (as in Mistral 7B).

    Memory stays constant however long the generation runs; the price is that a token
    can no longer attend further back than ``window`` steps. Keys are stored already
    rotated by RoPE, so their order in the ring does not matter: the mask, built from
    ``steps``, decides who sees whom.
    """

    def __init__(self, config: ModelConfig, batch_size: int, window: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        if window < 1:
            raise ValueError(f"window must be at least 1, got {window}")
        self.keys, self.values = _allocate(config, batch_size, window, dtype, device)
        self.slot_steps = torch.full((window,), -1, dtype=torch.long, device=device)
        self.window = window
        self.decode_needs_mask = True  # the ring may hold empty slots and steps out of window
        self.length = 0

    def _new_steps(self, n_new: int) -> torch.Tensor:
        return torch.arange(self.length, self.length + n_new, device=self.keys.device)

    def steps(self, n_new: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys: the ring's slots first, then the new tokens (which attend to each other too)."""
        new = self._new_steps(n_new)
        return new, torch.cat([self.slot_steps, new])

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


def kv_cache_bytes(config: ModelConfig, num_tokens: int, batch_size: int = 1,
                   bytes_per_value: int = 2) -> int:
    """Size of a full KV cache: 2 (K and V) x layers x kv_heads x head_dim x tokens x batch."""
    return (2 * config.num_layers * config.num_kv_heads * config.head_dim
            * num_tokens * batch_size * bytes_per_value)
