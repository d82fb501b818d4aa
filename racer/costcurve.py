"""The hardware cost curve: verify-forward time t(T, context) for tree size T on this model,
device and dtype, and the prefill's time for a prompt of n tokens. Measured once (seconds),
cached on disk, interpolated at use.

On a GPU t(64) ~ t(1); on a small CPU it is not (DESIGN.md §4), which is why tree sizes
must come from this curve rather than from a paper's default. The prefill has its own points
because the tree curve stops at 64 tokens, is timed at a context of 128 or more, and a prompt's
attention grows with its square: extrapolated linearly, its time for a prompt of 8-2048 tokens
sat 0.70-1.14x from the measured prefill, so the race's quiet estimate of a prefill (racer.race),
a ratio learnt on one prompt, could not carry to a prompt of another length; the timed points
sit 0.81-0.99x (`python scripts/prefill_shape.py`; docs/PERFORMANCE.md, "The race's clock").
"""
from __future__ import annotations

import json
import platform
import random
import statistics
import time
from bisect import bisect_left
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

from . import cpu
from .cpu.rows import argmax
from .kvcache import new_cache
from .models import LoadedModel
from .paths import keyed_file
from .tree import DraftTree
from .verify import forward_tree

CPU_SIZES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)
GPU_SIZES = CPU_SIZES + (96, 128)
CONTEXTS = (128, 512, 1536)
#: Prompt lengths whose prefill `get_cost_curve` times (those below the model's context; the app
#: takes prompts up to 2048 tokens on a CPU): about 15 s on a 2-core CPU, most of it the longest.
PREFILL_TOKENS = (16, 32, 64, 128, 256, 512, 1024, 2048)
#: `get_cost_curve` times rounds over all sizes until STEADY_ROUNDS rounds in a row lowered no
#: size's fastest time by more than STEADY_GAIN (so at least 6: a first and five steady ones; at
#: most MAX_ROUNDS a context). Five rounds take about 7 s here, and a busy 7 s bends the curve:
#: load slows the one-token forward, which streams memory, more than the compute-bound large
#: trees, so the curve's low end flattens and sizing keeps larger trees than pay. Measured on a
#: 2-core AVX512-BF16 CPU in a busy hour:
#: two 5-round curves read t(1) = 13.6 and 13.8 ms and t(16)/t(1) = 1.38 and 1.46, two 25-round
#: ones 12.3 and 10.6 ms and 1.50 and 1.82; the benchmark group's 5-round curve of that hour (t(1)
#: 15.9, flat to 8 nodes) sized racer to 9.6 nodes a step against 8.2 and ran 1.6 % slower than
#: by a 25-round one (docs/PERFORMANCE.md §4, "The curve's rounds").
STEADY_ROUNDS, STEADY_GAIN, MAX_ROUNDS = 5, 0.02, 25


@dataclass
class CostCurve:
    sizes: list[int]
    contexts: list[int]
    ms: list[list[float]]          # ms[c][s]: median forward ms at contexts[c], sizes[s]
    key: dict[str, str]
    measured_at: str = ""
    prefill_tokens: list[int] = field(default_factory=list)   # prompt lengths whose prefill was timed
    prefill_ms: list[float] = field(default_factory=list)     # their median prefill ms, from an empty cache

    def t(self, size: int, context: int) -> float:
        """Interpolated forward ms (linear in T and in context; clamped outside the grid
        in context, extrapolated linearly beyond the largest T)."""
        return self._across_contexts([[self._at_size(size, ci)] for ci in range(len(self.contexts))], context)[0]

    def ts(self, n: int, context: int) -> list[float]:
        """[t(1, context), ..., t(n, context)], equal to calling t() for each size; sizing asks for
        every size at every step, so the per-size values at the grid contexts are kept."""
        grid = self.__dict__.get("_per_size")
        if grid is None or len(grid[0]) < n:
            grid = [[self._at_size(T, ci) for T in range(1, n + 1)] for ci in range(len(self.contexts))]
            self.__dict__["_per_size"] = grid
        return self._across_contexts([row[:n] for row in grid], context)

    def _across_contexts(self, rows: list[list[float]], context: int) -> list[float]:
        """Per-size values at `context` from rows[ci] = the values at contexts[ci]: linear in
        context, clamped below the grid, extrapolated above it (never downwards)."""
        cs = self.contexts
        if context <= cs[0]:
            return rows[0]
        if context >= cs[-1]:
            if len(cs) == 1:
                return rows[-1]
            d = cs[-1] - cs[-2]
            return [b + max(0.0, (b - a) / d) * (context - cs[-1]) for a, b in zip(rows[-2], rows[-1])]
        j = bisect_left(cs, context)
        w = (context - cs[j - 1]) / (cs[j] - cs[j - 1])
        return [a * (1 - w) + b * w for a, b in zip(rows[j - 1], rows[j])]

    def _at_size(self, size: int, ci: int) -> float:
        s, y = self.sizes, self.ms[ci]
        if size <= s[0]:
            return y[0]
        if size >= s[-1]:
            slope = (y[-1] - y[-2]) / (s[-1] - s[-2]) if len(s) > 1 else 0.0
            return y[-1] + max(0.0, slope) * (size - s[-1])
        j = bisect_left(s, size)
        w = (size - s[j - 1]) / (s[j] - s[j - 1])
        return y[j - 1] * (1 - w) + y[j] * w

    def prefill(self, tokens: int) -> float:
        """Prefill ms for a prompt of `tokens` tokens fed into an empty cache: linear between the
        timed lengths (from the one-token forward below the shortest), a parabola through the last
        three beyond the longest (attention grows with the square; never flatter than the last
        segment). A curve without prefill points (an older cache file) falls back to the tree
        curve at the smallest context."""
        xs, ys = self.prefill_tokens, self.prefill_ms
        if not xs:
            return self.t(tokens, 0)
        if tokens <= xs[0]:
            one = min(self._at_size(1, 0), ys[0])
            w = (tokens - 1) / (xs[0] - 1) if xs[0] > 1 else 1.0
            return one + max(0.0, w) * (ys[0] - one)
        if tokens <= xs[-1]:
            j = bisect_left(xs, tokens)
            w = (tokens - xs[j - 1]) / (xs[j] - xs[j - 1])
            return ys[j - 1] * (1 - w) + ys[j] * w
        last = ys[-1] + (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) * (tokens - xs[-1]) if len(xs) > 1 else ys[-1] * tokens / xs[-1]
        if len(xs) < 3:
            return last
        (x0, x1, x2), (y0, y1, y2) = xs[-3:], ys[-3:]
        # Lagrange form of the parabola through the last three points.
        x = tokens
        par = (y0 * (x - x1) * (x - x2) / ((x0 - x1) * (x0 - x2)) + y1 * (x - x0) * (x - x2) / ((x1 - x0) * (x1 - x2))
               + y2 * (x - x0) * (x - x1) / ((x2 - x0) * (x2 - x1)))
        return max(last, par)

    def table(self, context: int, sizes: list[int] | None = None) -> dict[str, list[float]]:
        sizes = sizes or self.sizes
        return {"sizes": list(sizes), "ms": [round(self.t(s, context), 3) for s in sizes]}

    def to_dict(self) -> dict:
        return asdict(self)


def curve_key(lm: LoadedModel) -> dict[str, str]:
    cpu_name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    dev = str(lm.device)
    if lm.device.type == "cuda":
        dev = torch.cuda.get_device_name(lm.device)
    attn = str(getattr(lm.model.config, "_attn_implementation", "?"))
    return {"format": "6", "cache": "growing", **cpu.signature(lm.model), "attn": attn, "model": lm.name,
            "spec": lm.spec, "device": dev, "dtype": str(lm.dtype).replace("torch.", ""),
            "threads": str(torch.get_num_threads()), "cpu": cpu_name, "torch": torch.__version__}


def _cache_file(key: dict[str, str]) -> Path:
    return keyed_file("costcurves", key, ".json")


def random_tree(rng: random.Random, size: int, vocab: int) -> DraftTree:
    """A bushy tree (not a chain), so the measured cost includes the custom mask path."""
    t = DraftTree.root_only(rng.randrange(vocab))
    while len(t) < size:
        t.add(rng.randrange(len(t)), rng.randrange(vocab), "logits")
    return t


@torch.inference_mode()
def measure(lm: LoadedModel, sizes: tuple[int, ...] | None = None, contexts: tuple[int, ...] = CONTEXTS,
            repeats: int = 5, progress: Callable[[str], None] | None = None,
            prefill: tuple[int, ...] = (), max_rounds: int | None = None) -> CostCurve:
    """Time tree forwards of each size at each context (and, with `prefill`, the prefill of
    prompts of those lengths): `repeats` timed rounds, or with `max_rounds` more, until the
    fastest times hold steady (STEADY_ROUNDS, STEADY_GAIN) or `max_rounds` rounds were timed."""
    most = max(repeats, max_rounds or repeats)
    sizes = sizes or (GPU_SIZES if lm.device.type == "cuda" else CPU_SIZES)
    contexts = tuple(c for c in contexts if c + max(sizes) < lm.max_context) or (min(64, lm.max_context // 2),)
    rng = random.Random(0)
    vocab = lm.vocab_size
    grid: list[list[float]] = []
    for ci, ctx in enumerate(contexts):
        cache = new_cache(lm.model)
        lm.model(input_ids=torch.tensor([[rng.randrange(vocab) for _ in range(ctx)]], device=lm.device),
                 cache=cache, use_cache=True, logits_to_keep=1)
        # Interference from other processes only ever adds time: each size's fastest forward is
        # the machine's own cost.
        best = [float("inf")] * len(sizes)
        # Rounds over all sizes (not one size at a time): a burst of load from elsewhere then
        # spreads over the sizes instead of inflating one of them, which would bend the
        # curve's shape -- and the shape (t(T)/t(1)) is what sizing decides on.
        steady = 0   # rounds in a row that lowered no size's fastest time by more than STEADY_GAIN
        for r in range(most + 1):
            if r > repeats and steady >= STEADY_ROUNDS:
                break
            if progress:
                progress(f"measuring the cost curve: context {ctx} ({ci + 1} of {len(contexts)}), round {r + 1} "
                         f"of {repeats + 1}" + (f" to {most + 1}, until the times hold steady" if most > repeats else ""))
            lowered = False
            for si, size in enumerate(sizes):
                tree = random_tree(rng, size, vocab) if size > 1 else DraftTree.root_only(rng.randrange(vocab))
                if lm.device.type == "cuda":
                    torch.cuda.synchronize(lm.device)
                t0 = time.perf_counter()
                logits = forward_tree(lm.model, cache, tree, ctx, lm.device, lm.dtype, lm.layout)
                argmax(logits).tolist()  # the loop reads the argmax back; include that sync
                dt = (time.perf_counter() - t0) * 1e3
                cache.crop(-size)
                if r:  # the first round warms the kernels for every shape
                    lowered = lowered or dt < best[si] * (1 - STEADY_GAIN)
                    best[si] = min(best[si], dt)
            if r:
                steady = 0 if lowered else steady + 1
        row = best
        # Larger trees never cost less; enforce it so one noisy point cannot mislead sizing.
        for si in range(1, len(row)):
            row[si] = max(row[si], row[si - 1])
        grid.append(row)
    lengths = [n for n in prefill if n < lm.max_context]
    return CostCurve(list(sizes), list(contexts), grid, curve_key(lm), time.strftime("%Y-%m-%d %H:%M:%S"),
                     lengths, measure_prefill(lm, lengths, rng, progress) if lengths else [])


@torch.inference_mode()
def measure_prefill(lm: LoadedModel, lengths: list[int], rng: random.Random,
                    progress: Callable[[str], None] | None = None, rounds: int = 3) -> list[float]:
    """The median of `rounds` prefills of random prompts of each length, as the decode loop feeds
    a prompt: into an empty cache, the last position's logits kept. Rounds over all lengths (as
    above). The median and not the fastest: the race judges a prefill by its ratio to these
    points, so their shape across lengths is what matters, and on a shared host the fastest of
    two caught a fast moment at the short lengths (16 tokens 20-30 % below later timings)."""
    times: list[list[float]] = [[] for _ in lengths]
    for r in range(rounds):
        if progress:
            progress(f"measuring the cost curve: prefills of {lengths[0]}-{lengths[-1]} tokens, round {r + 1}/{rounds}")
        for i, n in enumerate(lengths):
            ids = torch.tensor([[rng.randrange(lm.vocab_size) for _ in range(n)]], device=lm.device)
            cache = new_cache(lm.model)
            if lm.device.type == "cuda":
                torch.cuda.synchronize(lm.device)
            t0 = time.perf_counter()
            logits = lm.model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1).logits
            argmax(logits[0]).tolist()
            times[i].append((time.perf_counter() - t0) * 1e3)
            del cache
    row = [statistics.median(t) for t in times]
    for i in range(1, len(row)):   # a longer prompt never costs less
        row[i] = max(row[i], row[i - 1])
    return row


def get_cost_curve(lm: LoadedModel, remeasure: bool = False,
                   progress: Callable[[str], None] | None = None) -> CostCurve:
    """The cached curve for this model/device/dtype/threads, measuring it if needed (seconds).
    Kept as `lm.cost_curve` too, so one process measures at most once."""
    if lm.cost_curve is not None and not remeasure:
        return lm.cost_curve
    key = curve_key(lm)
    path = _cache_file(key)
    curve = None
    if path.is_file() and not remeasure:
        try:
            d = json.loads(path.read_text())
            if d.get("key") == key:
                curve = CostCurve(**d)
        except (ValueError, TypeError):
            curve = None
    if curve is None:
        curve = measure(lm, progress=progress, prefill=PREFILL_TOKENS, max_rounds=MAX_ROUNDS)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(curve.to_dict()))
            tmp.replace(path)
        except OSError:
            pass  # a read-only cache only costs a re-measure next start
    lm.cost_curve = curve
    return curve
