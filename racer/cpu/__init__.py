"""racer's CPU backend: hand-written kernels and the decoder-layer swap that make a few-token
verify forward cheap on a small CPU. Nothing here is part of the method; every output is what
PyTorch's own path computes (bit for bit where a module says so, else to float rounding).

Model loading calls `attention_implementation()` before it builds the model and `install()`
after; each kernel family has one switch (racer.cpu.switches) and its own fallback.

    build.py      compiles csrc/*.cpp once per machine, self-checks the build
    linear.py     linear layers: tiled (ours), packed (oneDNN), small-batch, stock
    norm.py       Llama-family RMSNorm
    attention.py  tree attention without KV-cache copies; bf16 and float32 step attention (ours)
    layers.py     Llama-family decoder layers without transformers' module tree
    silu_mul      (csrc only) the MLP's silu(gate) * up in one bf16 call, used by layers.py
    rows.py       each logits row's argmax and top-k
    hugepages.py  the weights' memory on 2 MiB pages
"""
from __future__ import annotations

from typing import Any

import torch

from . import attention, hugepages, layers, linear, norm
from .build import extension, source_tag, unavailable_reason
from .switches import ON, Switches


def attention_implementation(requested: str) -> str:
    """The attention implementation to build the model with: "sdpa" runs as racer's variant of it
    (the same function, except that tree masks on grouped-query models skip the per-layer copy
    of the KV cache); anything else as asked."""
    return attention.register() if requested == "sdpa" else requested


def install(model: torch.nn.Module, device: torch.device, dtype: torch.dtype, linear_kernel: str = "auto",
            fast_layers: bool = True) -> list[str]:
    """Put racer's kernels into `model` where they apply, in place; returns the notes that say
    which run. `linear_kernel` "auto" takes RACER_LINEAR, whose "auto" is the kernel measured
    fastest for this device and dtype (linear.choose); `fast_layers` False keeps transformers'
    decoder layers (a model whose layers accelerate's hooks run). Raises ValueError for a kernel
    that cannot run here."""
    notes: list[str] = []
    asked = ON.linear if linear_kernel == "auto" else linear_kernel
    kernel = linear.choose(device, dtype) if asked == "auto" else asked
    if kernel != "stock":
        linear.use_kernel(model, kernel)
        tiled = (f"tiled AVX2 linear kernel for 1..{linear.TILED_MAX_ROWS}-token forwards, oneDNN packed above "
                 "(a reordered copy of every weight)") if dtype != torch.bfloat16 else \
            "packed AVX512-BF16 linear kernel for every forward (a copy of every weight in its layout)"
        notes.append({"tiled": tiled,
                      "packed": "oneDNN packed linear kernel (a reordered copy of every weight)",
                      "small-batch": "small-batch linear kernel (W @ x.T) for 2..64-token forwards"}[kernel])
    if device.type == "cpu" and asked != "stock" and norm.use_fast_norm(model):
        notes.append("racer's RMSNorm kernel")
    if device.type == "cpu" and kernel == "tiled" and ON.fast_layer and fast_layers and layers.use_fast_layers(model):
        rows = "every forward" if dtype == torch.bfloat16 else f"1..{linear.TILED_MAX_ROWS}-token forwards"
        silu = ", silu * up kernel" if ON.silu_mul and layers.silu_mul_count(model) else ""
        notes.append(f"racer's decoder-layer forward for {rows} (fused q/k/v and gate/up, rotary kernel{silu}; "
                     "bit-identical to the module path)")
    impl = getattr(model.config, "_attn_implementation", None)
    if device.type == "cpu" and impl == attention.NAME and attention.step_kernel_available(dtype):
        notes.append("racer's bf16 step-attention kernel for every forward, prefill included (exact: a tree "
                     "node's logits equal the one-token forward's)" if dtype == torch.bfloat16 else
                     f"racer's float32 step-attention kernel for 1..{attention.F32_MAX_ROWS}-token forwards (exact: "
                     "a tree node's logits equal the one-token forward's)")
    if asked == "auto" and kernel == "packed" and linear.tiled_unavailable_reason():
        notes.append(f"tiled linear kernel unavailable ({linear.tiled_unavailable_reason()})")
    if device.type == "cpu":
        # Last, once every copy the kernels keep exists.
        huge = model.__dict__["_racer_huge_pages"] = hugepages.back_model(model)
        if huge:
            notes.append(f"weights on 2 MiB pages ({huge >> 20} MiB)")
    return notes


def signature(model: torch.nn.Module) -> dict[str, str]:
    """What of racer's CPU backend a model runs, for cache keys (a cost curve measured on one
    set-up must not size trees on another)."""
    param = next(model.parameters(), None)
    if param is not None and param.device.type != "cpu":
        # None of the CPU kernels runs there; asking whether they are built would build them.
        return {"kernel": "stock", "layers": "module", "norm": "torch", "step_attention": "torch", "rows": "torch",
                "silu_mul": "torch"}
    kernel = linear.kernel_of(model)
    if kernel == "tiled":
        kernel += f"-{source_tag()}-rows{linear.TILED_MAX_ROWS}"
    return {"kernel": kernel, "layers": "fast" if ON.fast_layer and layers.count(model) else "module",
            "norm": "racer" if ON.norm and extension() is not None else "torch",
            "step_attention": "racer" if attention.step_kernel_available(param.dtype if param is not None
                                                                         else torch.bfloat16) else "torch",
            "rows": "racer" if ON.rows and extension() is not None else "torch",
            "silu_mul": "racer" if ON.silu_mul and layers.silu_mul_count(model) else "torch",
            "pages": "2M" if model.__dict__.get("_racer_huge_pages") else "4K"}


__all__ = ["ON", "Switches", "attention_implementation", "install", "signature", "extension", "unavailable_reason",
           "attention", "hugepages", "layers", "linear", "norm"]
