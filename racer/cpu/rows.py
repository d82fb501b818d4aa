"""Each row's argmax and top-k of a step's logits: racer's kernel (csrc/logit_rows.cpp) on a CPU
where it is built (and RACER_ROW_KERNEL is not 0), PyTorch elsewhere.

After every verify forward the loop needs each node's argmax and, for the copy-logit drafters, its
top-k ids and probabilities. For 5 bf16 rows of a 49,152-token vocabulary PyTorch took 0.55 ms
for the argmax and 1.0 ms for the top-k with probabilities (its logsumexp alone 0.8); the kernel
takes 0.016 and 0.075 (2-core EPYC, /tmp microbenchmark): about 6 % of a RACER step.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .build import extension
from .switches import ON


def _native(logits: torch.Tensor) -> Any:
    if ON.rows and logits.device.type == "cpu" and logits.dim() == 2 \
            and logits.dtype in (torch.float32, torch.bfloat16) and logits.shape[-1] > 0:
        return extension()
    return None


def kernel_available() -> bool:
    """Whether CPU rows run racer's kernel here."""
    return ON.rows and extension() is not None


def top_k_leads_with_argmax(logits: torch.Tensor) -> bool:
    """Whether `top_k` of these logits starts each row with its `argmax`: racer's kernel orders
    ties by the lower id, as argmax picks the first; PyTorch's topk leaves ties in any order."""
    return _native(logits) is not None


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """(rows,) int64: the first index of each row's largest value, as torch.argmax."""
    ops = _native(logits)
    return ops.argmax_rows(logits) if ops is not None else logits.argmax(dim=-1)


def top_k(logits: torch.Tensor, k: int, probs: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """The k most likely next-token ids per row of `logits`, most likely first, and, if asked,
    their softmax probabilities (float32)."""
    ops = _native(logits)
    if ops is not None and 1 <= k <= logits.shape[-1]:
        ids, p = ops.topk_rows(logits, k, probs)
        return ids.numpy(), (p.numpy() if probs else None)
    values, ids = logits.topk(k, dim=-1)
    if not probs:
        return ids.cpu().numpy(), None
    p = (values.float() - logits.float().logsumexp(dim=-1, keepdim=True)).exp()
    return ids.cpu().numpy(), p.cpu().numpy()
