"""How close a decoding method runs to the machine's limit.

A verify forward of a small model on a CPU is memory-bound: it streams every weight once,
whatever the tree's size (up to the few rows the kernels tile). So weight bytes x forwards per
second is the bandwidth a method draws, and the machine's own streaming read bandwidth, measured
on the same threads, is the ceiling: a method at 90 % of it can only go faster by making fewer
forwards (a longer accepted run per forward), not by running them faster. gpt-fast prints
"Bandwidth achieved" the same way. The KV cache a forward also reads (a few % of the weights at
these contexts) is left out, so the figure slightly understates the draw.
"""
from __future__ import annotations

import statistics
import time
from typing import Any

import torch
from torch import nn

#: Buffer of the read test: several times any CPU's last-level cache, so it streams from memory.
STREAM_MIB = 512


def weight_bytes(model: nn.Module) -> int:
    """Bytes of weight one forward streams: every parameter once (tied ones once), except an
    input embedding that is not also the output projection (a forward reads a few of its rows)."""
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    skip = set()
    if emb is not None and getattr(emb, "weight", None) is not None:
        tied = out is not None and getattr(out, "weight", None) is not None \
            and out.weight.data_ptr() == emb.weight.data_ptr()
        if not tied:
            skip.add(emb.weight.data_ptr())
    seen, total = set(), 0
    for p in model.parameters():
        ptr = p.data_ptr()
        if ptr in seen or ptr in skip:
            continue
        seen.add(ptr)
        total += p.numel() * p.element_size()
    return total


def stream_read_gbs(device: torch.device | str = "cpu", mib: int = STREAM_MIB, repeats: int = 7) -> float:
    """The machine's streaming read bandwidth, GB/s: the median of `repeats` sums over a float32
    buffer of `mib` MiB, on torch's current threads (the decoding's own)."""
    device = torch.device(device)
    buf = torch.ones(mib * 2**20 // 4, dtype=torch.float32, device=device)
    times = []
    for i in range(repeats + 1):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t = time.perf_counter()
        buf.sum()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i:  # the first pass faults the pages in
            times.append(time.perf_counter() - t)
    return buf.numel() * 4 / statistics.median(times) / 1e9


#: Fresh buffers `measure` reads: on the 2-core EPYC machines one buffer read at 28-32 GB/s and
#: the next at 45-54 (the same code, seconds apart: where the pages land), so one is not enough.
BUFFERS = 5


def measure(model: nn.Module, device: torch.device | str = "cpu") -> dict[str, Any]:
    """The two figures a report needs, and how they were taken: the ceiling is the fastest of
    `BUFFERS` fresh buffers (each the median of its reads), the slowest kept beside it."""
    device = torch.device(device)
    rates = [stream_read_gbs(device) for _ in range(BUFFERS)]
    where = (f"on {torch.cuda.get_device_name(device)}" if device.type == "cuda"
             else f"{torch.get_num_threads()} threads")
    return {"weight_bytes": weight_bytes(model), "stream_gbs": round(max(rates), 2),
            "stream_min_gbs": round(min(rates), 2),
            "stream_how": f"the fastest of {BUFFERS} fresh {STREAM_MIB} MiB float32 buffers, each the median of "
                          f"7 sums, {where}"}


def drawn(bandwidth: dict[str, Any] | None, ms_per_step: float | None) -> dict[str, float] | None:
    """Forwards per second of decoding (one per step after the first token), the weight GB/s they
    stream and its share of the measured streaming bandwidth; None when either is unknown."""
    if not bandwidth or not ms_per_step or ms_per_step <= 0 or not bandwidth.get("weight_bytes"):
        return None
    fps = 1e3 / ms_per_step
    gbs = bandwidth["weight_bytes"] * fps / 1e9
    share = gbs / bandwidth["stream_gbs"] if bandwidth.get("stream_gbs") else None
    return {"forwards_per_s": fps, "weight_gbs": gbs, "of_stream": share}
