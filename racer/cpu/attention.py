"""Tree attention without copying the KV cache for grouped-query models.

transformers' sdpa path, given a 4D mask (every tree, and every multi-token step: its mask
cannot be `is_causal`), expands K and V from the key/value heads to all query heads
(`repeat_kv`): a copy of the whole cache, in every layer, at every step. For one query token
it avoids that by folding the query heads of a group into the query length ("pack_gqa"); this
does the same for T query tokens: the n query heads sharing a key/value head become n*T query
rows against that one head, with the mask repeated n times along the rows. Same arithmetic,
no cache copy. One token without a mask is folded the same way. Measured on the default model
(9 query / 3 key-value heads), context 1,500:
a verify forward of T = 2..8 tokens is 1.1-1.2x faster; at context 300 the gain is within
noise (python -m racer.kernelbench.attention_kernels).

In bfloat16 on a CPU with AVX512-BF16, every forward runs racer's own kernel instead
(csrc/step_attention.cpp): a step is 2.7-4.4x faster per call than the packed sdpa call at context
300-1,500, and a prefill (blocks of 64 query rows) 2.2-2.7x faster than PyTorch's flash kernel on
256-1,536 tokens. A query row's result depends only on its query and the keys it sees, so a tree
node's logits equal those of the one-token forward bit for bit, and a prefill's those of feeding
its tokens one at a time (PyTorch's flash kernel rounds differently with the number of rows: bf16
ties). In float32, steps of 1..F32_MAX_ROWS query tokens run racer's float32 kernel (AVX2,
csrc/step_attention_f32.cpp) on the same principle: a row from its own key list, so float32 tree
decoding equals one-token decoding bit for bit too (PyTorch's kernel differed in the last bits); a
whole verify forward of the default model at context 300 ran 1.02x faster at one token, 1.13x at
four and 1.07x at eight than with the packed sdpa call (benchmarks/micro/attention-kernels-float32-*).
Longer float32 forwards (prefills) stay on PyTorch's flash kernel. RACER_STEP_ATTENTION=0 turns
both kernels off.

Registered with transformers' attention and mask interfaces as "racer_sdpa"; everything it
does not handle (several tokens without a mask, one token with a mask, no GQA, non-CPU devices, extras such as softcap or a
position bias) goes to transformers' own sdpa function unchanged.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any

import torch
import torch.nn.functional as F

from .build import extension
from .linear import tiled_bf16_available
from .switches import ON

NAME = "racer_sdpa"


def tree_sdpa_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      is_causal: bool | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    n = int(getattr(module, "num_key_value_groups", 1) or 1)
    B, H, T, D = query.shape
    out = _step_kernel(module, query, key, value, attention_mask, dropout, scaling, kwargs)
    if out is not None:
        return out, None
    # A tree (T > 1 with a 4D mask), or one token with no mask: transformers takes sdpa's
    # enable_gqa path for the latter, which on CPU in bfloat16 cost 5x the packed call (320
    # against 64 us a layer at context 600).
    shaped = (T > 1 and attention_mask is not None and attention_mask.dim() == 4 and attention_mask.shape[1] == 1) \
        or (T == 1 and attention_mask is None)
    if (n > 1 and shaped and query.device.type == "cpu" and not (dropout and module.training)
            and kwargs.get("position_bias") is None and kwargs.get("softcap") is None
            and key.shape[1] * n == H and key.shape[-1] == D == value.shape[-1]):
        # Query heads g*n .. g*n+n-1 share key/value head g (repeat_kv's order).
        q = query.reshape(B, H // n, n * T, D)
        mask = None if attention_mask is None else _repeated(attention_mask, B, T, n)
        out = F.scaled_dot_product_attention(q, key, value, attn_mask=mask, scale=scaling)
        return out.reshape(B, H, T, D).transpose(1, 2).contiguous(), None
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  is_causal=is_causal, **kwargs)


def _step_kernel(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: torch.Tensor | None, dropout: float, scaling: float | None,
                 kwargs: dict[str, Any]) -> torch.Tensor | None:
    """Attention by racer's step kernel for the dtype (bfloat16: every forward; float32: up to
    F32_MAX_ROWS query tokens), (B, T, H, D); None where it does not apply."""
    B, H, T, D = query.shape
    dtype = query.dtype
    shape_ok = D in (64, 128) if dtype == torch.bfloat16 else D % 32 == 0 and T <= F32_MAX_ROWS
    if not (ON.step_attention and dtype == key.dtype == value.dtype and B == 1 and T >= 1 and shape_ok
            and query.device.type == "cpu"
            and key.dim() == 4 and key.shape[1] > 0 and H % key.shape[1] == 0 and key.shape[-1] == D
            and value.shape == key.shape and key.shape[2] >= T
            and not (dropout and module.training) and kwargs.get("position_bias") is None
            and kwargs.get("softcap") is None and kwargs.get("sinks") is None):
        return None
    ops = _step_ops(dtype)
    if ops is None:
        return None
    if attention_mask is None:
        # transformers passes no mask only for causal attention (or one token).
        if T > 1 and not getattr(module, "is_causal", True):
            return None
        visible = None
    else:
        visible = _visible(attention_mask, key.shape[2])
        if visible is None or visible.shape[0] != T:
            return None
    scale = scaling if scaling is not None else D ** -0.5
    run = ops.step_attention_bf16 if dtype == torch.bfloat16 else ops.step_attention_f32
    return run(query, key, value, visible, float(scale))


#: float32 steps of up to this many query tokens run the float32 kernel; more (a prefill) go to
#: PyTorch's flash kernel: their linear products run oneDNN (racer.cpu.linear.TILED_MAX_ROWS), which
#: is not batch-invariant, so the kernel's exactness would buy nothing there.
F32_MAX_ROWS = 64


def _step_ops(dtype: torch.dtype = torch.bfloat16) -> Any:
    """The built kernels where `dtype`'s step kernel runs here, else None."""
    return _bf16_ops() if dtype == torch.bfloat16 else extension() if dtype == torch.float32 else None


@lru_cache(maxsize=1)
def _bf16_ops() -> Any:
    return extension() if tiled_bf16_available() else None


def step_kernel_available(dtype: torch.dtype = torch.bfloat16) -> bool:
    """Whether `dtype`'s steps run racer's step-attention kernel here (bfloat16: AVX512-BF16;
    float32: AVX2; the kernels built, not turned off by RACER_STEP_ATTENTION=0)."""
    return ON.step_attention and _step_ops(dtype) is not None


class _PerForward:
    """The last result computed from a forward's mask, keyed on the mask's identity and the
    other arguments: every layer of a forward gets the same mask tensor, so the work runs once
    per forward, not per layer. The strong reference keeps the id from being reused; masks are
    built fresh for each forward and never written in place. One tuple, read once: safe across
    threads."""

    def __init__(self, compute: Any) -> None:
        self.compute = compute
        self.last: tuple[torch.Tensor, tuple[Any, ...], Any] | None = None

    def __call__(self, mask: torch.Tensor, *args: Any) -> Any:
        hit = self.last
        if hit is not None and hit[0] is mask and hit[1] == args:
            return hit[2]
        out = self.compute(mask, *args)
        self.last = (mask, args, out)
        return out


def _visibility(mask: torch.Tensor, keys: int) -> torch.Tensor | None:
    """(T, L) bool, True where a query sees a key; None for a mask it cannot express (an
    additive bias other than 0 / blocked, a batch of masks, a length other than the keys')."""
    if not (mask.dim() == 4 and mask.shape[0] == 1 and mask.shape[1] == 1 and mask.shape[-1] == keys):
        return None
    m = mask[0, 0]
    vis: torch.Tensor | None = None
    if m.dtype == torch.bool:
        vis = m.contiguous()
    elif m.is_floating_point():
        seen = m == 0
        if bool((seen | (m <= torch.finfo(m.dtype).min / 2)).all()):
            vis = seen.contiguous()
    if vis is not None and not bool(vis.any(dim=-1).all()):
        return None  # a row that sees nothing: leave its definition to PyTorch
    return vis


# The mask as the step kernel's visibility, and repeated along the query rows for the packed call.
_visible = _PerForward(_visibility)
_repeated = _PerForward(lambda mask, B, T, n: mask.expand(B, 1, T, mask.shape[-1]).repeat(1, 1, n, 1))


def know_visibility(mask: torch.Tensor, visible: torch.Tensor) -> None:
    """Hand the step kernel the visibility of `mask` ((T, L) bool, True where a query sees a key,
    every row seeing one) where the caller built both from one tree: the forward then does not
    read the float mask back, five passes over it (about 0.05-0.1 ms a tree step in decoding)."""
    _visible.last = (mask, (visible.shape[-1],), visible)


def register() -> str:
    """Make "racer_sdpa" a transformers attention implementation (idempotent); returns its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, tree_sdpa_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME
