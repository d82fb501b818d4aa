"""Linear kernels for CPU tree verification.

Verifying a draft tree multiplies every weight matrix by a handful of rows (T = 1..64). The
decoder is memory-bound there: ideally a T-row product costs about what streaming W once costs.
PyTorch's `x @ W.T` on CPU goes through MKL, which on this project's AMD machines is far from
that: measured (2-core AVX2 EPYC, float32, SmolLM2-135M shapes) M=2 costs 1.9x M=1. The
replacements, chosen per model by `choose`:

- "tiled": our own AVX2/FMA kernel (csrc/tiled_linear.cpp) for 1..TILED_MAX_ROWS rows,
  built once per machine with the system C++ compiler and cached; prefill (more rows) goes to
  "packed". Per call (float32, SmolLM2-135M shapes, weights in cache) oneDNN's inner product
  spends 35-40 us even on a 192x576 weight at one row; the tiled kernel 7-9 us. Inside a real
  forward the weights stream from memory, and streaming and multiplying did not overlap by
  themselves (a 4-row forward's linears cost the 1-row time plus the in-cache compute); v2
  prefetches the next weight block while multiplying the current one and keeps 12
  accumulators for every row count: in-situ forward 1.10-1.19x faster than v1 at T = 1..12,
  and the 49152-wide vocabulary projection 1.00-1.15x faster than oneDNN, so it runs tiled
  too. Whole verify forward (benchmarks/micro/kernels-tiled-v2-float32.md): 1.46x faster than
  "packed" at T = 1, t(4)/t(1) = 1.13, t(8)/t(1) = 1.37. Its per-row result does not depend
  on how many rows share the call. From 5 rows on, a block of W takes two or more passes, and
  each pass prefetches its share of the next block (before, only the first pass did): on an
  AVX2 Zen 1, whose 256-bit FMAs run as two halves (family 23 model 1, 2 cores), the whole
  verify forward ran 1.01-1.05x faster at T = 5-16 and the same at T = 1-4, bit-identical
  (benchmarks/micro/tiled-linear-prefetch-float32-avx2-2026-12-07.md, scripts/kernel_ab.py).
  Most weights no longer pass through L2: one pass (1-4 rows) prefetches the next block
  non-temporally, and from 5 rows at K <= 640 (every weight of the default model but the MLP's
  down projection, which keeps the L2 hint) each 3-row tile of W takes all its passes while it
  sits in L1, the next tile fetched non-temporally. Fetched into L2, the 538 MB a float32 forward
  streams evicted the KV cache and all that Python and PyTorch touch between the products. On the
  Zen 1, against the L2 hint, bit-identical: 1.07-1.12x faster at T = 1-4 (1.12-1.17x for the
  non-temporal pass alone, measured twice), 1.00-1.12x at 5-8, 1.02-1.04x at 10-16
  (benchmarks/micro/tiled-linear-nta-float32-avx2-2026-12-07.md).
  In bfloat16, on a CPU with AVX512-BF16, "tiled" runs csrc/packed_linear_bf16.cpp instead
  (vdpbf16ps, float32 sums, one rounding) on a copy of each weight packed once for it, 16
  outputs to a register, for every number of rows, prefill included (on par with oneDNN there),
  so the layer keeps that copy instead of oneDNN's. oneDNN's bf16 inner product took about three
  times the weight-streaming time at one row. Against the row-major bf16 kernel it replaced,
  the model's linears (streamed, SmolLM2-135M shapes) ran 1.1-1.3x faster at 1-8 rows and
  1.4-1.6x at 12-32 (docs/PERFORMANCE.md §3).
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

from .build import bf16, extension, unavailable_reason

KERNELS = ("tiled", "packed", "small-batch", "stock")

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

    def _copy_name(self) -> str:
        """Where the copy of the weight this class multiplies is kept (`NAME_of`: its stamp)."""
        return "_racer_packed"

    def _make_copy(self, weight: torch.Tensor) -> torch.Tensor:
        return _pack(weight)

    def _packed(self) -> torch.Tensor:
        """The copy of the weight this class multiplies, made again whenever the weight changed."""
        w, name = self.weight, self._copy_name()
        # The version counter moves on every in-place write (load_state_dict, optimiser steps).
        stamp = (w._version, w.data_ptr(), w.dtype)
        d = self.__dict__
        if d.get(name + "_of") != stamp:
            d[name], d[name + "_of"] = self._make_copy(w), stamp
        return d[name]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (torch.is_grad_enabled() or x.device.type != "cpu" or self.weight.device.type != "cpu"
                or x.dtype != self.weight.dtype or x.numel() == 0):
            return super().forward(x)
        return torch.ops.mkldnn._linear_pointwise(x, self._packed(), self.bias, "none", [], "")


# The tiled kernel's row limit; above it (prefill) oneDNN's blocked GEMM takes over. With the
# v2 kernel a verify forward of 20-64 tokens ran 1.08-1.25x faster tiled than packed (context
# 300, interleaved), so trees of any size the sizing picks on a CPU stay on it.
TILED_MAX_ROWS = 64


def tiled_available() -> bool:
    """Whether the float32 tiled kernel runs here (builds the kernels on first call); oneDNN
    takes the prefill rows above TILED_MAX_ROWS."""
    return extension() is not None and packed_available(torch.float32)


def tiled_unavailable_reason() -> str | None:
    return None if tiled_available() else (unavailable_reason() or "oneDNN packed kernel unavailable")


@lru_cache(maxsize=None)  # asked at every bfloat16 product; the build and the CPU do not change
def tiled_bf16_available() -> bool:
    """Whether the bfloat16 kernel runs here: the kernels build and the CPU has AVX512-BF16."""
    return bf16()


def _tiled_runs(dtype: torch.dtype) -> bool:
    if dtype == torch.float32:
        return tiled_available()
    return dtype == torch.bfloat16 and tiled_bf16_available()


def pack_bf16(weight: torch.Tensor) -> torch.Tensor:
    """`weight` (bfloat16, out x in) in the layout of the bfloat16 kernel (`packed_linear_bf16`)."""
    return extension().pack_bf16(weight.detach())


class TiledLinear(PackedLinear):
    """nn.Linear computed by racer's kernels: in float32 the tiled kernel for 1..TILED_MAX_ROWS
    rows, oneDNN on the reordered weight above; in bfloat16 (where the CPU has AVX512-BF16) the
    packed kernel for every number of rows, on the weight packed for it. Everything else as
    PackedLinear."""

    def _copy_name(self) -> str:
        w = self.weight
        # Kept apart from oneDNN's copy, so A/B timing can switch kernels without repacking.
        bf = w.dtype == torch.bfloat16 and w.device.type == "cpu" and tiled_bf16_available()
        return "_racer_bf16" if bf else "_racer_packed"

    def _make_copy(self, weight: torch.Tensor) -> torch.Tensor:
        return pack_bf16(weight) if self._copy_name() == "_racer_bf16" else _pack(weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if x.dtype not in _TILED_DTYPES or w.dtype != x.dtype or x.device.type != "cpu" or w.device.type != "cpu" \
                or torch.is_grad_enabled() or x.numel() == 0:
            return super().forward(x)
        if x.dtype == torch.bfloat16:
            if tiled_bf16_available():
                return extension().packed_linear_bf16(x, self._packed(), self.out_features, self.bias)
            return super().forward(x)
        if x.numel() // x.shape[-1] <= TILED_MAX_ROWS:
            return extension().tiled_linear(x, w, self.bias)
        return super().forward(x)


_TILED_DTYPES = (torch.float32, torch.bfloat16)


_CLASSES: dict[str, type[nn.Linear]] = {"tiled": TiledLinear, "packed": PackedLinear,
                                        "small-batch": SmallBatchLinear, "stock": nn.Linear}


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
    """The KERNELS this build and CPU can run in `dtype` (the tiled one takes float32 only)."""
    def runs(k: str) -> bool:
        if k == "packed":
            return packed_available(dtype)
        if k == "tiled":
            return _tiled_runs(dtype)
        return True
    return [k for k in KERNELS if runs(k)]


def choose(device: torch.device, dtype: torch.dtype) -> str:
    """The kernel measured fastest for this device and dtype: on CPU in float32 "tiled" where it
    builds, else "packed" where oneDNN runs, else "small-batch"; "stock" elsewhere. In bfloat16
    on a CPU without native bf16 the replacements were measured slower
    (python -m racer.kernelbench.linear_kernels --dtype bfloat16); with AVX512-BF16 the bf16 tiled kernel
    runs where it builds."""
    if device.type != "cpu" or dtype not in _TILED_DTYPES:
        return "stock"
    if _tiled_runs(dtype):
        return "tiled"
    if dtype == torch.bfloat16:
        return "stock"
    return "packed" if packed_available(dtype) else "small-batch"


def use_kernel(model: nn.Module, kernel: str, keep_packed: bool = False) -> int:
    """Switch every plain linear layer of `model` (nn.Linear or one of ours) to `kernel`, in
    place; returns how many. Quantised or custom subclasses keep their own forward. The class
    swap keeps parameters, hooks and tied weights; "packed" and "tiled" make their copies of the
    weights now (oneDNN's reordered one, or in bfloat16 the packed kernel's), so the first
    decoding step does not pay for it. Switching frees the copies the new kernel does not use
    unless keep_packed (for A/B timing that switches back and forth)."""
    if kernel not in _CLASSES:
        raise ValueError(f"unknown linear kernel {kernel!r}; one of {KERNELS}")
    if kernel in ("packed", "tiled") and not any(packed_available(p.dtype) for p in model.parameters()):
        raise ValueError(f"the {kernel} kernel needs oneDNN support for this dtype on this CPU")
    if kernel == "tiled" and not tiled_available():
        raise ValueError(f"the tiled kernel cannot run here: {tiled_unavailable_reason()}")
    cls = _CLASSES[kernel]
    n = 0
    for module in model.modules():
        if type(module) in _CLASSES.values():
            module.__class__ = cls
            if issubclass(cls, PackedLinear) and module.weight.device.type == "cpu":
                module._packed()
            if not keep_packed:
                drop_packed(module, keep_own=True)
            n += 1
    return n


def drop_packed(module: nn.Module, keep_own: bool = False) -> None:
    """Free the copies of `module`'s weight made for a kernel (with `keep_own`, those its current
    class uses are kept); they are made again on next use."""
    own = module._copy_name() if keep_own and isinstance(module, PackedLinear) else None
    for name in ("_racer_packed", "_racer_bf16"):
        if name != own:
            module.__dict__.pop(name, None)
            module.__dict__.pop(name + "_of", None)


def kernel_of(model: nn.Module) -> str:
    """Which of KERNELS the model's linear layers run ("stock" when none of ours)."""
    for module in model.modules():
        for name, cls in _CLASSES.items():
            if cls is not nn.Linear and type(module) is cls:
                return name
    return "stock"
