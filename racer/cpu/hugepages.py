"""The model's weights on 2 MiB pages (Linux transparent huge pages).

Every verify forward streams all the weights its products read (about 270 MB for the default
model in bfloat16). On 4 KiB pages that is some 66,000 pages a forward, far more than the TLB
holds, so every page costs a page-table walk, and under a hypervisor a nested one. Where the
system leaves huge pages to programs that ask (`/sys/kernel/mm/transparent_hugepage/enabled`
set to `madvise`, as on this project's machines), PyTorch's allocations never get them.

After the kernels have made their copies of the weights, `back_model` asks for huge pages over
the memory of the tensors a forward multiplies: MADV_HUGEPAGE, then MADV_COLLAPSE (Linux 6.1+),
which moves the pages already there onto 2 MiB pages now instead of leaving it to khugepaged. Both
keep the memory's contents as they are, so outputs do not change. The ranges are widened to
whole 2 MiB pages (a tensor shares its first and last page with its neighbours), which keeps a
few more megabytes resident. Measured on the default model (2-core AMD EPYC with AVX512-BF16,
the model loaded twice in one process, forwards interleaved: python -m racer.kernelbench.huge_pages):
4 KiB / 2 MiB pages 1.01-1.03x in bfloat16 and 1.00-1.04x in float32 at 1-16 nodes
(docs/PERFORMANCE.md §3). It speeds every method alike.

Off with RACER_HUGE_PAGES=0; elsewhere than Linux, or where the kernel refuses, nothing changes.
"""
from __future__ import annotations

import ctypes
import os
import sys
from typing import Any, Iterable

import torch

from .layers import plan_weights

PAGE = 2 << 20
_MADV_HUGEPAGE, _MADV_COLLAPSE = 14, 25
#: Tensors smaller than this are left alone (norm weights, biases): they are not what streams.
MIN_BYTES = 256 << 10


def enabled() -> bool:
    return sys.platform.startswith("linux") and os.environ.get("RACER_HUGE_PAGES", "1").strip() != "0"


def _madvise() -> Any:
    libc = ctypes.CDLL(None, use_errno=True)
    fn = libc.madvise
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return fn


def streamed_tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    """The CPU tensors a forward of `model` multiplies: each decoder-layer plan's weights
    (racer.cpu.layers), and for every other linear layer the bfloat16 kernel's copy where it
    keeps one, else its weight. The weights a plan or a copy replaced are left alone: nothing
    reads them."""
    plans = [p for p in (m.__dict__.get("_racer_plan") for m in model.modules()) if p is not None]
    planned = {id(lin) for p in plans for lin in p.linears}
    out: list[Any] = []
    for p in plans:
        out += plan_weights(p)
    for m in model.modules():
        if isinstance(m, torch.nn.Linear) and id(m) not in planned:
            # oneDNN's reordered copies (`_racer_packed`) are opaque: their memory cannot be reached.
            copy = m.__dict__.get("_racer_bf16")
            out.append(copy if isinstance(copy, torch.Tensor) else m.weight)
    return [t for t in out if isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.layout == torch.strided
            and not t.is_mkldnn]


def page_ranges(tensors: Iterable[torch.Tensor]) -> list[tuple[int, int]]:
    """The whole 2 MiB pages the storages of `tensors` (those of MIN_BYTES or more) lie on,
    merged where they touch."""
    spans = []
    for t in tensors:
        st = t.untyped_storage()
        start, size = st.data_ptr(), st.nbytes()
        if size >= MIN_BYTES and start:
            spans.append((start // PAGE * PAGE, (start + size + PAGE - 1) // PAGE * PAGE))
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted(spans):
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


def back_model(model: torch.nn.Module) -> int:
    """Move the memory of `model`'s tensors onto 2 MiB pages where the system allows; returns the
    bytes collapsed (0 where nothing could be)."""
    if not enabled():
        return 0
    try:
        madvise = _madvise()
    except (OSError, AttributeError):
        return 0
    done = 0
    for lo, hi in page_ranges(streamed_tensors(model)):
        madvise(lo, hi - lo, _MADV_HUGEPAGE)
        for page in range(lo, hi, PAGE):
            # A page that is not all anonymous memory (part of a file's mapping, a guard page), or
            # a kernel without MADV_COLLAPSE, refuses: that page stays as it was.
            if madvise(page, PAGE, _MADV_COLLAPSE) == 0:
                done += PAGE
    return done
