"""Small-batch linear layers for CPU tree verification.

Verifying a draft tree multiplies every weight matrix by a handful of rows (T = 2..64).
On CPU, PyTorch's `x @ W.T` for such a small M is far from the cost of streaming W once:
measured here (2-core AVX2 EPYC, float32, SmolLM2-135M shapes) M=2 costs 1.9x M=1 and M=8
costs 1.9x, while the same product computed as `(W @ x.T).T` costs ~1.0x and ~1.5x. The
decoder is memory-bound at these sizes, so the cheaper kernel flattens the whole cost curve
t(T) and with it raises the tree size worth drafting.

The numbers differ from `x @ W.T` only by summation order (float rounding), exactly as any
other change of kernel or of T would. M=1 keeps PyTorch's own path, so plain greedy
decoding is untouched.
"""
from __future__ import annotations

import torch
from torch import nn

# Above this many rows the library GEMM is as fast or faster (measured on the cost curve).
MAX_ROWS = 64


class SmallBatchLinear(nn.Linear):
    """nn.Linear whose forward uses W @ x.T for 2..MAX_ROWS rows; same parameters and state dict."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        if not (2 <= rows <= MAX_ROWS) or x.device.type != "cpu" or torch.is_grad_enabled():
            return super().forward(x)
        flat = x.reshape(rows, x.shape[-1])
        y = (self.weight @ flat.T).T
        if self.bias is not None:
            y = y + self.bias
        # Contiguous output: measured faster overall than handing a transposed view downstream.
        return y.contiguous().reshape(*x.shape[:-1], self.out_features)


def helps(device: torch.device, dtype: torch.dtype) -> bool:
    """Where the kernel was measured faster: float32 on CPU. In bfloat16 on a CPU without
    native bf16 it is 8-15 % slower than PyTorch's (python -m racer.bench.kernels --dtype bfloat16)."""
    return device.type == "cpu" and dtype == torch.float32


def use_small_batch_linear(model: nn.Module) -> int:
    """Switch every plain nn.Linear of `model` to SmallBatchLinear in place; returns how many.

    Only exact nn.Linear instances are switched (quantised or custom subclasses keep their own
    forward), and the class swap keeps parameters, hooks and tied weights as they are."""
    n = 0
    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = SmallBatchLinear
            n += 1
    return n


def use_stock_linear(model: nn.Module) -> int:
    """Undo use_small_batch_linear (for A/B measurements)."""
    n = 0
    for module in model.modules():
        if type(module) is SmallBatchLinear:
            module.__class__ = nn.Linear
            n += 1
    return n
