"""What each tree size cost and committed in a benchmark run's own decoding.

For every verification step of a method, its forward's ms against `ar`'s forward on the same
question at the same context (the median of `ar`'s nine steps around that position, from the same
interleaved run), and the tokens the step committed. Grouped by tree size: how often the sizer chose
it, what it cost in one-token forwards, what it committed, and the tokens per one-token forward's
time that buys. Beside it, the run's cost curve at the run's context (`summary.json`), which is what
sizing priced the sizes by (before the first-pass price, docs/PERFORMANCE.md §4), so the table shows
where the quiet-loop curve and the run's forwards part.

    .venv/bin/python scripts/tree_costs.py benchmarks/smollm2-135m-specbench10-float32-avx2-2026-12-07
    .venv/bin/python scripts/tree_costs.py RUN --methods racer,tr --min-steps 50
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from racer.costcurve import CostCurve  # noqa: E402 - after the path


def ar_forwards(rows: list[dict]) -> dict[tuple[str, int], tuple[int, list[float]]]:
    """(question, turn) -> (prompt length, `ar`'s forward ms per step)."""
    return {(r["question_id"], r["turn"]): (r["prompt_len"], r["step_ms"]["forward"])
            for r in rows if r["method"] == "ar" and r.get("step_ms")}


def ar_at(ar: tuple[int, list[float]], context: int) -> float:
    """`ar`'s forward ms at `context`: the median of its nine steps around that position."""
    prompt_len, ms = ar
    i = min(max(context - prompt_len, 0), len(ms) - 1)
    return statistics.median(ms[max(0, i - 4):i + 5])


def by_size(rows: list[dict], method: str) -> dict[int, list[tuple[float, int]]]:
    """Tree size -> [(forward / ar's forward, tokens committed)] over the method's steps."""
    ar = ar_forwards(rows)
    out: dict[int, list[tuple[float, int]]] = defaultdict(list)
    for r in rows:
        key = (r["question_id"], r["turn"])
        if r["method"] != method or key not in ar or not r.get("step_ms"):
            continue
        context = r["prompt_len"]
        for size, accepted, ms in zip(r["tree_sizes"], r["accept_lengths"], r["step_ms"]["forward"]):
            if size:  # size 0: a step that committed its token without a forward
                out[size].append((ms / ar_at(ar[key], context), accepted))
            context += accepted
    return out


def curve_ratios(run: Path) -> tuple[int, dict[int, float]]:
    """The run's cost curve at its context, t(T) / t(1) for T up to its largest measured size,
    read as sizing reads it (`CostCurve.t`: straight between the measured sizes)."""
    summary = json.loads((run / "summary.json").read_text())
    c = summary.get("cost_curve") or {}
    if not c.get("ms"):
        return 0, {}
    context = c.get("context", 0)
    curve = CostCurve(c["sizes"], c.get("contexts") or [context], c.get("grid") or [c["ms"]], {})
    one = curve.t(1, context)
    return context, {T: curve.t(T, context) / one for T in range(1, c["sizes"][-1] + 1)}


def table(groups: dict[int, list[tuple[float, int]]], curve: dict[int, float], min_steps: int) -> list[str]:
    steps = sum(len(v) for v in groups.values())
    lines = ["| tree nodes | steps | share | forward / `ar`'s | cost curve t(T)/t(1) (interpolated) | tokens a step | tokens per `ar` forward |",
             "|---|---|---|---|---|---|---|"]
    for size in sorted(groups):
        v = groups[size]
        if len(v) < min_steps:
            continue
        cost = statistics.median(c for c, _ in v)
        tokens = statistics.mean(a for _, a in v)
        c = f"{curve[size]:.3f}" if size in curve else ""
        lines.append(f"| {size} | {len(v)} | {len(v) / steps:.1%} | {cost:.3f} | {c} | {tokens:.2f} | {tokens / cost:.2f} |")
    rest = [x for size, v in groups.items() if len(v) < min_steps for x in v]
    if rest:
        lines.append(f"| other sizes | {len(rest)} | {len(rest) / steps:.1%} | | | {statistics.mean(a for _, a in rest):.2f} | |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a benchmark run folder (results.jsonl, summary.json) with `ar` in it")
    ap.add_argument("--methods", default=None, help="comma-separated (default: every method but ar and hf*)")
    ap.add_argument("--min-steps", type=int, default=20, help="sizes with fewer steps are pooled")
    args = ap.parse_args()
    rows = [json.loads(line) for line in (args.run / "results.jsonl").read_text().splitlines() if line.strip()]
    methods = args.methods.split(",") if args.methods else sorted(
        {r["method"] for r in rows if r["method"] != "ar" and not r["method"].startswith("hf")})
    context, curve = curve_ratios(args.run)
    print(f"{args.run.name}: each step's forward against `ar`'s at the same question and context (median); "
          f"cost curve at context {context}\n")
    for method in methods:
        groups = by_size(rows, method)
        if not groups:
            continue
        print(f"`{method}`\n")
        print("\n".join(table(groups, curve, args.min_steps)))
        print()


if __name__ == "__main__":
    main()
