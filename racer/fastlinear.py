"""Linear kernels for CPU tree verification.

Verifying a draft tree multiplies every weight matrix by a handful of rows (T = 1..64). The
decoder is memory-bound there: ideally a T-row product costs about what streaming W once costs.
PyTorch's `x @ W.T` on CPU goes through MKL, which on this project's AMD machines is far from
that: measured (2-core AVX2 EPYC, float32, SmolLM2-135M shapes) M=2 costs 1.9x M=1. Two
replacements, chosen per model by `choose`:

- "packed": oneDNN's inner product on a weight reordered once into oneDNN's blocked layout
  (the path PyTorch's own inductor uses for frozen CPU linears). Whole verify forward
  (benchmarks/micro/kernels-float32.md): t(8)/t(1) = 1.37 against 1.59 for "small-batch" and
  1.80 for "stock", 1.4x faster than "stock" at T = 2..8 and ~6 % at T = 1. It keeps a
  second copy of every weight (the reordered one), so a float32 model takes twice its memory;
  a weight changed in place is re-packed on its next use.
- "small-batch": `(W @ x.T).T` for 2..64 rows, which reads W once; no extra memory.
- "stock": nn.Linear as shipped.

Kernels differ only by summation order (float rounding), as any change of kernel or of T does.
Every method of a run shares the model and so the kernel: greedy identity is unaffected.
"""
from __future__ import annotations

from functools import lru_cache

import torch
from torch import nn

KERNELS = ("packed", "small-batch", "stock")

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


def _pack(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)


class PackedLinear(nn.Linear):
    """nn.Linear computed by oneDNN on a reordered copy of the weight (held outside the state
    dict). Autograd, non-CPU inputs and dtype mismatches take nn.Linear's own path."""

    _racer_packed: torch.Tensor
    _racer_packed_of: tuple[int, int, torch.dtype]

    def _packed(self) -> torch.Tensor:
        w = self.weight
        # The version counter moves on every in-place write (load_state_dict, optimiser steps).
        stamp = (w._version, w.data_ptr(), w.dtype)
        if getattr(self, "_racer_packed_of", None) != stamp:
            self._racer_packed = _pack(w)
            self._racer_packed_of = stamp
        return self._racer_packed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (torch.is_grad_enabled() or x.device.type != "cpu" or self.weight.device.type != "cpu"
                or x.dtype != self.weight.dtype or x.numel() == 0):
            return super().forward(x)
        return torch.ops.mkldnn._linear_pointwise(x, self._packed(), self.bias, "none", [], "")


_CLASSES: dict[str, type[nn.Linear]] = {"packed": PackedLinear, "small-batch": SmallBatchLinear, "stock": nn.Linear}


@lru_cache(maxsize=None)
def packed_available(dtype: torch.dtype) -> bool:
    """Whether this PyTorch build and CPU can run the packed kernel in `dtype` (oneDNN refuses
    bfloat16 on CPUs without AVX512-BF16/AVX-NE-CONVERT, for one)."""
    try:
        w = torch.ones(8, 8, dtype=dtype)
        y = torch.ops.mkldnn._linear_pointwise(torch.ones(2, 8, dtype=dtype), _pack(w), None, "none", [], "")
        return bool(torch.all(y == 8))
    except (RuntimeError, AttributeError, NotImplementedError):
        return False


def available(dtype: torch.dtype) -> list[str]:
    """The KERNELS this build and CPU can run in `dtype`."""
    return [k for k in KERNELS if k != "packed" or packed_available(dtype)]


def choose(device: torch.device, dtype: torch.dtype) -> str:
    """The kernel measured fastest for this device and dtype: on CPU in float32 "packed" where
    oneDNN runs, else "small-batch"; "stock" elsewhere. In bfloat16 on a CPU without native bf16
    both replacements were measured slower (python -m racer.bench.kernels --dtype bfloat16)."""
    if device.type != "cpu" or dtype != torch.float32:
        return "stock"
    return "packed" if packed_available(dtype) else "small-batch"


def use_kernel(model: nn.Module, kernel: str, keep_packed: bool = False) -> int:
    """Switch every plain linear layer of `model` (nn.Linear or one of ours) to `kernel`, in
    place; returns how many. Quantised or custom subclasses keep their own forward. The class
    swap keeps parameters, hooks and tied weights; "packed" reorders the weights now, so the
    first decoding step does not pay for it. Switching away frees the reordered copies unless
    keep_packed (for A/B timing that switches back and forth)."""
    if kernel not in _CLASSES:
        raise ValueError(f"unknown linear kernel {kernel!r}; one of {KERNELS}")
    if kernel == "packed" and not any(packed_available(p.dtype) for p in model.parameters()):
        raise ValueError("the packed kernel needs oneDNN support for this dtype on this CPU")
    cls = _CLASSES[kernel]
    n = 0
    for module in model.modules():
        if type(module) in _CLASSES.values():
            module.__class__ = cls
            if cls is PackedLinear and module.weight.device.type == "cpu":
                module._packed()
            elif not keep_packed:
                module.__dict__.pop("_racer_packed", None)
                module.__dict__.pop("_racer_packed_of", None)
            n += 1
    return n


def kernel_of(model: nn.Module) -> str:
    """Which of KERNELS the model's linear layers run ("stock" when none of ours)."""
    for module in model.modules():
        for name, cls in _CLASSES.items():
            if cls is not nn.Linear and type(module) is cls:
                return name
    return "stock"
