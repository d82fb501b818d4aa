"""The hardware cost curve for the report: verify-forward ms against tree size T, measured at
the benchmark's own context lengths after the timed runs (so it never disturbs them).

Uses `racer.costcurve.measure` (random bushy trees on a fresh cache after a prefill, median
of a few repeats, GPU synchronised); a small fallback does the same where that module is absent.
"""
from __future__ import annotations

import random
import statistics
import time
from typing import Any, Callable, Sequence

import torch

from ..models import LoadedModel
from ..tree import DraftTree
from ..verify import forward_tree

SIZES = (1, 2, 4, 8, 16, 32, 64)
REPEATS = 5


@torch.inference_mode()
def _measure_fallback(lm: LoadedModel, sizes: Sequence[int], contexts: Sequence[int], repeats: int) -> list[list[float]]:
    from transformers import DynamicCache
    rng = random.Random(0)
    grid = []
    for ctx in contexts:
        cache = DynamicCache(config=lm.model.config)
        lm.model(input_ids=torch.tensor([[rng.randrange(lm.vocab_size) for _ in range(ctx)]], device=lm.device),
                 cache=cache, use_cache=True, logits_to_keep=1)
        row = []
        for size in sizes:
            times = []
            for r in range(repeats + 1):
                tree = DraftTree.root_only(rng.randrange(lm.vocab_size))
                while len(tree) < size:
                    tree.add(rng.randrange(len(tree)), rng.randrange(lm.vocab_size), "logits")
                if lm.device.type == "cuda":
                    torch.cuda.synchronize(lm.device)
                t0 = time.perf_counter()
                logits = forward_tree(lm.model, cache, tree, ctx, lm.device, lm.dtype)
                logits.argmax(-1).tolist()
                dt = (time.perf_counter() - t0) * 1e3
                cache.crop(-size)
                if r:
                    times.append(dt)
            row.append(statistics.median(times))
        grid.append(row)
    return grid


def interpolate(sizes: Sequence[int], ms: Sequence[float], t: float) -> float:
    if t <= sizes[0]:
        return ms[0]
    for i in range(1, len(sizes)):
        if t <= sizes[i]:
            w = (t - sizes[i - 1]) / (sizes[i] - sizes[i - 1])
            return ms[i - 1] * (1 - w) + ms[i] * w
    return ms[-1]


def measure_cost_curve(lm: LoadedModel, contexts: Sequence[int], sizes: Sequence[int] = SIZES,
                       repeats: int = REPEATS, progress: Callable[[str], None] | None = None) -> dict[str, Any] | None:
    """{"sizes", "contexts", "grid" (ms[context][size]), "context", "ms" (at the middle context)}."""
    sizes = tuple(int(s) for s in sizes)
    ctxs = [int(c) for c in contexts if c >= 1 and c + max(sizes) < lm.max_context]
    if not ctxs:
        return None
    t0 = time.perf_counter()
    source = "racer.costcurve"
    try:
        from ..costcurve import measure
        curve = measure(lm, sizes=sizes, contexts=tuple(ctxs), repeats=repeats, progress=progress)
        ctxs, grid = list(curve.contexts), [list(r) for r in curve.ms]
        sizes = tuple(curve.sizes)
    except ImportError:
        source = "racer.bench.costs"
        grid = _measure_fallback(lm, sizes, ctxs, repeats)
    mid = len(ctxs) // 2
    return {"sizes": list(sizes), "contexts": ctxs, "grid": [[round(v, 3) for v in row] for row in grid],
            "context": ctxs[mid], "ms": [round(v, 3) for v in grid[mid]], "repeats": repeats,
            "measured_by": source, "measure_s": round(time.perf_counter() - t0, 2)}
