"""What the loop needs to know of a model's architecture to verify a draft tree exactly: which
attention each layer runs, how far a sliding window reaches, the real context limit, and which
attention implementation computes what the model was trained with.

A custom 4D mask bypasses transformers' own sliding-window masking, so the window is folded into
the tree mask here; a model that mixes full and sliding layers takes one mask per layer type (a
{layer type: mask} mapping, which transformers' hybrid models accept in place of a mask). The KV
cache keeps every layer's keys in full (racer.kvcache), so one set of positions serves all.
Anything else (chunked, linear or state-space attention, per-layer windows) is refused at load
with what is missing: the loop never guesses.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .tree import DraftTree

FULL, SLIDING = "full_attention", "sliding_attention"


class UnsupportedArchitecture(ValueError):
    """The model cannot be run exactly by tree verification; the message says why."""


def text_config(config: Any) -> Any:
    """The decoder's config (multimodal configs keep it in `text_config`)."""
    get = getattr(config, "get_text_config", None)
    return get(decoder=True) if callable(get) else getattr(config, "text_config", config)


def context_limit(config: Any, default: int = 2048) -> int:
    """The model's own context length (tokens), text_config included."""
    cfg = text_config(config)
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        v = getattr(cfg, name, None) or getattr(config, name, None)
        if isinstance(v, int) and v > 0:
            return v
    return default


def attention_implementation(config: Any, requested: str) -> tuple[str, str | None]:
    """The implementation to build the model with for `requested` ("sdpa" or "eager"), and a note
    when it differs: logit soft-capping inside attention (Gemma 2) is computed by the eager kernel
    only; transformers' sdpa path would silently leave it out."""
    cfg = text_config(config)
    if requested == "sdpa" and getattr(cfg, "attn_logit_softcapping", None):
        return "eager", "attention logit soft-capping: eager attention (sdpa would drop the soft-cap)"
    return requested, None


@dataclass(frozen=True)
class AttentionLayout:
    """The distinct attention kinds of a model's layers, in order of first appearance, and the
    sliding window (a key is visible while query position - key position < window)."""
    types: tuple[str, ...] = (FULL,)
    window: int | None = None

    @classmethod
    def of(cls, config: Any) -> "AttentionLayout":
        from transformers.cache_utils import get_layer_types_and_kwargs

        cfg = text_config(config)
        try:
            layer_types, kwargs = get_layer_types_and_kwargs(cfg)
        except Exception as e:  # noqa: BLE001 - a config transformers cannot read this way
            raise UnsupportedArchitecture(f"cannot read the attention layer types of this config ({e})") from e
        other = sorted({t for t in layer_types if t not in (FULL, SLIDING)})
        if other:
            raise UnsupportedArchitecture(f"layers of type {', '.join(other)}: tree verification handles full and "
                                          f"sliding-window attention only")
        windows = {int(k["sliding_window"]) for t, k in zip(layer_types, kwargs) if t == SLIDING}
        if len(windows) > 1:
            raise UnsupportedArchitecture(f"sliding windows of several sizes ({sorted(windows)}) across layers")
        types = tuple(dict.fromkeys(layer_types)) or (FULL,)
        return cls(types, windows.pop() if windows else None)

    @property
    def mixed(self) -> bool:
        return len(self.types) > 1

    def reaches(self, keys: int) -> bool:
        """Whether the window cuts anything off a query that sees `keys` positions."""
        return self.window is not None and keys > self.window

    def tree_mask(self, tree: DraftTree, past_len: int, dtype: torch.dtype,
                  device: torch.device | str) -> torch.Tensor | dict[str, torch.Tensor]:
        """The additive tree mask for every layer type: a tensor where all layers share one kind,
        else {layer type: tensor}."""
        full = tree.attention_mask(past_len, dtype, device)
        if self.window is None or not self.reaches(past_len + max(tree.depths) + 1):
            masks = {t: full for t in self.types}
        else:
            windowed = tree.attention_mask(past_len, dtype, device, window=self.window)
            masks = {t: windowed if t == SLIDING else full for t in self.types}
        return masks if self.mixed else masks[self.types[0]]
