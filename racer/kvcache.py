"""A KV cache that appends in place.

transformers' DynamicCache appends by `torch.cat`: every forward copies the whole cache of
every layer, so a step's cost grows with the context even for one token. On the default
model on this 2-core CPU that copy was 15-17 % of a verify forward at context 600 (torch
profiler, T = 1 and 8). `GrowingCache` keeps each layer's keys and values in a buffer with
spare room: an append writes only the new entries, dropping entries (a rejected draft
branch) only moves the length, and the buffer is reallocated geometrically when it is full.
Attention reads a view of the filled part, so nothing else changes.

Sliding-window layers keep every key too (transformers' sliding layer drops keys older than
the window): the tree mask folds the window in (racer.architecture), and one set of positions
then serves every layer, and the cache can be compacted the same way in each. Other layer
kinds keep the class transformers picked (the loop refuses such models at load).
"""
from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from .cpu.build import extension

#: Spare room, in tokens, when a buffer is first allocated or regrown; growth is at least 1.5x
#: so a long generation reallocates O(log n) times.
HEADROOM = 256


class GrowingLayer(DynamicLayer):
    """One layer's keys and values, (B, H, capacity, D) buffers of which the first `length`
    entries are live; `self.keys`/`self.values` are views of that live part, made when read (a crop
    after every verify step then only moves the length: making the views in each of 30 layers cost
    more than the step's whole cache compaction)."""

    _k: torch.Tensor | None = None
    _v: torch.Tensor | None = None
    length = 0

    @property
    def keys(self) -> torch.Tensor | None:  # type: ignore[override]
        return None if self._k is None else self._k[..., :self.length, :]

    @keys.setter
    def keys(self, value: torch.Tensor | None) -> None:
        # transformers assigns whole tensors (its __init__, offload, prefetch): that tensor is then
        # the buffer, all of it live.
        self._k = value
        self.length = 0 if value is None else int(value.shape[-2])

    @property
    def values(self) -> torch.Tensor | None:  # type: ignore[override]
        return None if self._v is None else self._v[..., :self.length, :]

    @values.setter
    def values(self, value: torch.Tensor | None) -> None:
        self._v = value

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self._k = self._v = None
        self.length = 0
        self.is_initialized = True

    @property
    def capacity(self) -> int:
        return 0 if self._k is None else int(self._k.shape[-2])

    def _reserve(self, need: int, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        cap = max(need + HEADROOM, self.capacity * 3 // 2)
        k = key_states.new_empty(*key_states.shape[:-2], cap, key_states.shape[-1])
        v = value_states.new_empty(*value_states.shape[:-2], cap, value_states.shape[-1])
        if self.length:
            k[..., :self.length, :] = self._k[..., :self.length, :]
            v[..., :self.length, :] = self._v[..., :self.length, :]
        self._k, self._v = k, v

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = self.length
        end = n + key_states.shape[-2]
        if (self._k is None or end > self.capacity or self._k.shape[:-2] != key_states.shape[:-2]
                or self._k.dtype != key_states.dtype):
            self._reserve(end, key_states, value_states)
        k, v = self._k[..., :end, :], self._v[..., :end, :]
        k[..., n:, :] = key_states
        v[..., n:, :] = value_states
        self.length = end
        return k, v

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized else 0

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative count of tokens to drop, not {tokens_to_remove}")
        if tokens_to_remove == 0 or not self.is_initialized or self._k is None:
            return
        self.length = max(0, self.length + tokens_to_remove)

    def reset(self) -> None:
        self._k = self._v = None
        self.length = 0
        self.is_initialized = False

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("GrowingCache holds one sequence")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise NotImplementedError("GrowingCache holds one sequence")

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        raise NotImplementedError("GrowingCache holds one sequence")


class GrowingCache(DynamicCache):
    """DynamicCache whose full and sliding-window attention layers append in place (GrowingLayer)."""

    def __init__(self, config: Any) -> None:
        super().__init__(config=config)
        self.layers = [GrowingLayer() if type(layer) in (DynamicLayer, DynamicSlidingWindowLayer) else layer
                       for layer in self.layers]

    def compact(self, past_len: int, path: list[int]) -> bool:
        """Move entries `past_len + path[j]` to `past_len + j` in every layer, in place, with racer's
        kernel (one call for all layers instead of two PyTorch ops per tensor); False, touching
        nothing, where it cannot run (a layer of another class or not on the CPU, no kernels)."""
        buffers = []
        for layer in self.layers:
            if type(layer) is not GrowingLayer:
                return False
            if layer._k is None:
                continue
            if layer._k.device.type != "cpu":
                return False
            buffers += [layer._k, layer._v]
        # Asked only for a CPU cache: on a GPU machine asking would build the CPU kernels (a minute).
        ops = extension()
        if ops is None or not hasattr(ops, "compact_rows"):
            return False
        ops.compact_rows(buffers, int(past_len), [int(i) for i in path])
        return True


def new_cache(model: Any) -> DynamicCache:
    """The cache every decode and every timing in racer uses for `model`."""
    return GrowingCache(model.config)
