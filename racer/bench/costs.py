"""The hardware cost curve for the report: verify-forward ms against tree size T, measured at
the benchmark's own context lengths after the timed runs (so it never disturbs them).

Uses `racer.costcurve.measure` (random bushy trees on a fresh cache after a prefill, minimum
of a few repeats, GPU synchronised).
"""
from __future__ import annotations

import time
from typing import Any, Callable, Sequence

from ..costcurve import measure
from ..models import LoadedModel

SIZES = (1, 2, 4, 8, 16, 32, 64)
REPEATS = 5


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
    curve = measure(lm, sizes=sizes, contexts=tuple(ctxs), repeats=repeats, progress=progress)
    ctxs, grid = list(curve.contexts), [list(r) for r in curve.ms]
    sizes = tuple(curve.sizes)
    mid = len(ctxs) // 2
    return {"sizes": list(sizes), "contexts": ctxs, "grid": [[round(v, 3) for v in row] for row in grid],
            "context": ctxs[mid], "ms": [round(v, 3) for v in grid[mid]], "repeats": repeats,
            "measured_by": source, "measure_s": round(time.perf_counter() - t0, 2)}
