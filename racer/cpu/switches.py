"""One switch per family of racer's CPU kernels, read from the environment at import and settable
at run time (the kernel micro-benchmarks flip them to compare both paths in one process).

    RACER_CPU_KERNELS=0     none of racer's compiled kernels (nothing is built)
    RACER_LINEAR=KERNEL     linear layers: auto (default), tiled, packed, small-batch or stock
    RACER_NORM_KERNEL=0     RMSNorm on PyTorch's ops instead of racer's kernel
    RACER_STEP_ATTENTION=0  attention on PyTorch's kernel instead of racer's step kernels (both dtypes)
    RACER_FAST_LAYER=0      transformers' decoder-layer modules instead of racer's forward
    RACER_SILU_MUL=0        in racer's bfloat16 layer forward, PyTorch's silu and mul instead of racer's kernel
    RACER_ROW_KERNEL=0      each row's argmax / top-k on PyTorch, the copy-logit store written by
                            numpy and a tree's forward inputs (ids, positions, mask) built by numpy
                            and torch, instead of racer's kernels
    RACER_HUGE_PAGES=0      the weights stay on the 4 KiB pages they were allocated on (racer.cpu.hugepages;
                            read when a model is loaded)

Every family falls back to PyTorch's own path where its kernel cannot run (no compiler, no AVX2,
another device or dtype); the model's load notes say which ran.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

LINEAR_CHOICES = ("auto", "tiled", "packed", "small-batch", "stock")


def _on(name: str) -> bool:
    return os.environ.get(name, "1").strip() != "0"


@dataclass
class Switches:
    compiled: bool = True
    linear: str = "auto"
    norm: bool = True
    step_attention: bool = True
    fast_layer: bool = True
    silu_mul: bool = True
    rows: bool = True

    @classmethod
    def from_env(cls) -> "Switches":
        linear = os.environ.get("RACER_LINEAR", "auto").strip() or "auto"
        if linear not in LINEAR_CHOICES:
            raise ValueError(f"RACER_LINEAR={linear!r}: use one of {', '.join(LINEAR_CHOICES)}")
        return cls(compiled=_on("RACER_CPU_KERNELS"), linear=linear, norm=_on("RACER_NORM_KERNEL"),
                   step_attention=_on("RACER_STEP_ATTENTION"), fast_layer=_on("RACER_FAST_LAYER"),
                   silu_mul=_on("RACER_SILU_MUL"), rows=_on("RACER_ROW_KERNEL"))


#: The switches every kernel family reads, per call.
ON = Switches.from_env()
