"""Does a prefill's quiet estimate keep its shape across prompt lengths? The cost curve is measured
afresh (its tree forwards and its timed prefills), then prompts of 8-2048 tokens are prefilled in
five interleaved rounds, and each length's median is set against the two estimates: the tree curve
extrapolated (what the race used before the curve timed prefills) and `CostCurve.prefill`.

    .venv/bin/python scripts/prefill_shape.py              # the default model, this machine's dtype
    .venv/bin/python scripts/prefill_shape.py --rounds 9

Prints a markdown table and, per estimate, how far a level learnt on a 150-token prompt is off at
the other lengths (docs/PERFORMANCE.md, "The race's clock").
"""
from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from racer.costcurve import get_cost_curve  # noqa: E402
from racer.kvcache import new_cache  # noqa: E402
from racer.models import load_model  # noqa: E402

LENGTHS = (8, 16, 24, 40, 64, 100, 150, 200, 300, 400, 700, 1024, 1500, 2048)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    lm = load_model(args.model)
    curve = get_cost_curve(lm, remeasure=True)
    tree_only = dataclasses.replace(curve, prefill_tokens=[], prefill_ms=[])
    lengths = [n for n in LENGTHS if n < lm.max_context]
    rng = random.Random(1)
    times: dict[int, list[float]] = {n: [] for n in lengths}
    with torch.inference_mode():
        for _ in range(args.rounds):
            for n in lengths:
                ids = torch.tensor([[rng.randrange(lm.vocab_size) for _ in range(n)]], device=lm.device)
                cache = new_cache(lm.model)
                t0 = time.perf_counter()
                lm.model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
                times[n].append((time.perf_counter() - t0) * 1e3)
    print(f"{lm.name}, {str(lm.dtype).replace('torch.', '')}; the curve's prefill points: "
          + ", ".join(f"{n}: {ms:.1f} ms" for n, ms in zip(curve.prefill_tokens, curve.prefill_ms)))
    print(f"| prompt tokens | measured ms (median of {args.rounds}) | tree curve, extrapolated | ratio "
          "| prefill points | ratio |\n|---|---|---|---|---|---|")
    ratios: dict[str, dict[int, float]] = {"tree curve": {}, "prefill points": {}}
    for n in lengths:
        m, a, b = statistics.median(times[n]), tree_only.prefill(n), curve.prefill(n)
        ratios["tree curve"][n], ratios["prefill points"][n] = m / a, m / b
        print(f"| {n} | {m:.1f} | {a:.1f} | {m / a:.2f} | {b:.1f} | {m / b:.2f} |")
    for name, r in ratios.items():
        at = r.get(150) or next(iter(r.values()))
        print(f"{name}: measured / estimate {min(r.values()):.2f}-{max(r.values()):.2f}; a level learnt at 150 "
              f"tokens is off by {min(r.values()) / at:.2f}-{max(r.values()) / at:.2f} elsewhere")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
