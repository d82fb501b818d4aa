"""Builds racer's CPU kernels (every csrc/*.cpp in one PyTorch extension) once per machine with
the system C++ compiler, caches the build, and checks it before anything uses it.

`extension()` is what every kernel family calls; it returns None where the kernels cannot run
(no AVX2/FMA, no compiler, RACER_CPU_KERNELS=0, a build that fails its self-check) and
`unavailable_reason()` then says why.
"""
from __future__ import annotations

import hashlib
import os
import sys
import threading
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from ..paths import cache_root
from .switches import ON

_CSRC = Path(__file__).with_name("csrc")
_lock = threading.Lock()
_error: str | None = None


def source_tag(csrc: Path = _CSRC) -> str:
    """A hash of the kernels' sources: a changed kernel gets its own build and cost curves."""
    files = sorted(csrc.glob("*.cpp")) + sorted(csrc.glob("*.h"))
    return hashlib.sha1(b"".join(p.read_bytes() for p in files)).hexdigest()[:12]


def _build_dir(tag: str) -> Path:
    return cache_root() / "kernels" / f"tiled-{tag}"


@lru_cache(maxsize=None)
def extension() -> Any:
    """The compiled kernels (tiled linear in float32, packed linear in bfloat16, step attention,
    RMSNorm, rotary embedding, per-row argmax / top-k), or None where they cannot run. Built on
    first use (about 50 s; progress on stderr) into the racer cache, keyed by the sources, PyTorch
    and Python versions, and loaded from there afterwards."""
    global _error
    if not ON.compiled:
        _error = "turned off by RACER_CPU_KERNELS=0"
        return None
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        _error = f"CPU capability {torch.backends.cpu.get_cpu_capability()} has no AVX2"
        return None
    with _lock:
        try:
            ops = compile_kernels()
            # A build that loads but computes wrongly (a miscompiling toolchain) must not be used.
            x, w = torch.randn(5, 37), torch.randn(11, 37)
            if not torch.allclose(ops.tiled_linear(x, w, None), x @ w.T, atol=1e-4):
                _error = "the built kernel failed its self-check"
                return None
            if ops.cpu_has_bf16():
                xb, wb = x.bfloat16(), w.bfloat16()
                want = (xb.float() @ wb.float().T).bfloat16()
                got = ops.packed_linear_bf16(xb, ops.pack_bf16(wb), wb.shape[0], None)
                if not torch.allclose(got.float(), want.float(), rtol=1e-2, atol=1e-2):
                    _error = "the built bfloat16 kernel failed its self-check"
                    return None
            return ops
        except Exception as e:  # noqa: BLE001 - any build failure means: use PyTorch's kernels
            _error = f"{e.__class__.__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"
            return None


def compile_kernels(csrc: Path = _CSRC) -> Any:
    """The kernels of the sources in `csrc`, built into the racer cache if not yet (no self-check:
    `extension()` is what decoding uses; another checkout's `csrc` gives that checkout's build, which
    scripts/kernel_ab.py times against this one's)."""
    from torch.utils import cpp_extension

    csrc = csrc.resolve()
    # The build records its sources' paths: each checkout gets its own folder, so two of them
    # never rebuild over each other.
    tag = hashlib.sha1((source_tag(csrc) + torch.__version__ + sys.version + str(csrc)).encode()).hexdigest()[:12]
    build = _build_dir(tag)
    build.mkdir(parents=True, exist_ok=True)
    # ninja may come from pip (requirements.txt), next to this interpreter, off PATH.
    here = os.path.dirname(sys.executable)
    if here not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = here + os.pathsep + os.environ.get("PATH", "")
    if not any(build.glob("*.so")):
        print("racer: building the CPU kernels (once per machine, about 50 s)", file=sys.stderr, flush=True)
    return cpp_extension.load(
        name=f"racer_tiled_{tag}", sources=[str(p) for p in sorted(csrc.glob("*.cpp"))], build_directory=str(build),
        extra_cflags=["-O3", "-mavx2", "-mfma", "-fopenmp"], extra_ldflags=["-fopenmp"], verbose=False)


def unavailable_reason() -> str | None:
    """Why `extension()` is None (None when it is built)."""
    return None if extension() is not None else (_error or "unknown")


def bf16() -> bool:
    """Whether the built kernels run bfloat16 here (the CPU has AVX512-BF16)."""
    ops = extension()
    return ops is not None and bool(ops.cpu_has_bf16())
