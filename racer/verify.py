"""Verifying a draft tree: one forward with tree attention, then the accepted path.

Acceptance is lossless by construction:
- greedy: descend from the root while a child carries the argmax at its parent; the argmax
  at the last accepted node is the next root. Output = plain greedy decoding.
- sampling: at each node draw the next token from the target's processed distribution;
  descend if a child carries it, else commit the draw and stop. Every committed token is
  then an exact sample of the target, whatever the draft was (drafts are deterministic
  candidates, so no rejection correction is needed).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .architecture import AttentionLayout
from .cpu.attention import know_visibility
from .cpu.build import extension
from .cpu.rows import argmax
from .cpu.switches import ON
from .tree import DraftTree

FULL_ONLY = AttentionLayout()


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = 0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def process_logits(logits: torch.Tensor, s: Sampling) -> torch.Tensor:
    """Probabilities (float32) after temperature, top-k and top-p, for a 1D or 2D logits tensor."""
    x = logits.float() / max(s.temperature, 1e-6)
    if s.top_k and 0 < s.top_k < x.shape[-1]:
        kth = torch.topk(x, s.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if s.top_p < 1.0:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        # Keep the smallest prefix whose mass reaches top_p (the token that crosses it stays).
        drop_sorted = (sorted_p.cumsum(-1) - sorted_p) >= s.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def forward_tree(model: Any, cache: Any, tree: DraftTree, past_len: int, device: torch.device,
                 dtype: torch.dtype, layout: AttentionLayout | None = None) -> torch.Tensor:
    """Logits (T, V) at every tree node; appends T entries to `cache`. `layout` gives the
    model's layer types and sliding window (default: full attention everywhere)."""
    ids, mask, pos = _inputs(tree, past_len, device, dtype, layout or FULL_ONLY)
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True)
    return out.logits[0]


def _inputs(tree: DraftTree, past_len: int, device: torch.device | str, dtype: torch.dtype,
            layout: AttentionLayout) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The forward's token ids, attention mask and positions for `tree`."""
    if tree.is_chain():
        # A chain is ordinary causal attention: let the model build its own (faster) masks, sliding
        # windows included (the cache keeps every key, so its positions are the context's).
        return torch.tensor([tree.tokens], dtype=torch.long, device=device), None, None
    if not _one_visibility(layout, device):
        return (torch.tensor([tree.tokens], dtype=torch.long, device=device),
                layout.tree_mask(tree, past_len, dtype, device), tree.position_ids(past_len, device))
    ops = _inputs_kernel(layout, device, dtype)
    if ops is not None:
        # One kernel call builds what the lines below build from half a dozen numpy and torch calls.
        ids, pos, visible, mask = ops.tree_inputs(tree.tokens, tree.parents, past_len, dtype)
    else:
        ids = torch.tensor([tree.tokens], dtype=torch.long, device=device)
        pos = tree.position_ids(past_len, device)
        visible = tree.visibility(past_len)
        mask = DraftTree.additive_mask(visible, dtype)
    # One visibility serves the mask and the step kernel, which then never reads the mask.
    know_visibility(mask, visible)
    return ids, mask, pos


def _one_visibility(layout: AttentionLayout, device: torch.device | str) -> bool:
    """Whether a tree's mask is its visibility alone: full attention in every layer, on the CPU."""
    return layout.window is None and not layout.mixed and torch.device(device).type == "cpu"


def _inputs_kernel(layout: AttentionLayout, device: torch.device | str, dtype: torch.dtype) -> Any:
    """racer's CPU kernel that builds a tree's forward inputs (csrc/tree_inputs.cpp), where the mask
    is the visibility alone, the kernel is built and RACER_ROW_KERNEL is not 0; else None."""
    if not (ON.rows and dtype.is_floating_point and _one_visibility(layout, device)):
        return None
    return extension()


def accept_greedy(tree: DraftTree, logits: torch.Tensor, best: list[int] | None = None) -> tuple[list[int], int]:
    """`best`: each node's argmax where the caller has it already (the first of its top-k, which
    breaks ties by the lower id as argmax does), else read from `logits`."""
    if best is None:
        best = argmax(logits).tolist()
    node, path = 0, [0]
    while True:
        child = tree.child(node, best[node])
        if child < 0:
            return path, best[node]
        node = child
        path.append(node)


def accept_sampling(tree: DraftTree, logits: torch.Tensor, s: Sampling,
                    generator: torch.Generator) -> tuple[list[int], int]:
    node, path = 0, [0]
    while True:
        probs = process_logits(logits[node], s)
        draw = int(torch.multinomial(probs, 1, generator=generator).item())
        child = tree.child(node, draw)
        if child < 0:
            return path, draw
        node = child
        path.append(node)


def keep_path(cache: Any, past_len: int, path: list[int], tree_len: int) -> None:
    """Leave only the accepted path's entries after the prefix in every layer's KV cache."""
    if path == list(range(len(path))):
        drop = tree_len - len(path)
        if drop:
            cache.crop(-drop)
        return
    compact = getattr(cache, "compact", None)
    if compact is not None and compact(past_len, path):
        cache.crop(-(tree_len - len(path)))
        return
    src = torch.tensor(path, dtype=torch.long) + past_len
    on: dict[torch.device, torch.Tensor] = {}   # one copy per device a layer lives on (a split model)
    for layer in cache.layers:
        if not getattr(layer, "is_initialized", True) or layer.keys is None:
            continue
        dev = layer.keys.device
        idx = on.get(dev)
        if idx is None:
            idx = on[dev] = src if dev.type == "cpu" else src.pin_memory().to(dev, non_blocking=True)
        n = len(path)
        # Copy the path's entries down in place (O(path), not O(context)), then crop the tail.
        layer.keys[..., past_len:past_len + n, :] = layer.keys.index_select(-2, idx)
        layer.values[..., past_len:past_len + n, :] = layer.values.index_select(-2, idx)
    cache.crop(-(tree_len - len(path)))
