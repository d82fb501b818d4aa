"""Verify-forward time against tree size in float32 and bfloat16, interleaved in one run:

    python -m racer.bench.dtypes [--context 300] [--repeats 9] [--sizes 1,8,16,32,64]

Prints a markdown table of median ms and the float32/bfloat16 ratio (>1: bfloat16 faster).
"""
from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from ..costcurve import _random_tree
from ..models import load_model
from ..verify import forward_tree


@torch.inference_mode()
def main() -> None:
    from transformers import DynamicCache

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="default")
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--sizes", default="1,8,16,32,64")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    models = {dt: load_model(args.model, device="cpu", dtype=dt) for dt in ("float32", "bfloat16")}
    rng = random.Random(0)
    caches = {}
    for dt, lm in models.items():
        caches[dt] = DynamicCache(config=lm.model.config)
        ids = torch.tensor([[rng.randrange(lm.vocab_size) for _ in range(args.context)]])
        lm.model(input_ids=ids, cache=caches[dt], use_cache=True, logits_to_keep=1)
    times: dict[tuple[str, int], list[float]] = {(dt, T): [] for dt in models for T in sizes}
    for rep in range(args.repeats + 1):
        for T in sizes:
            for dt, lm in models.items():  # interleaved: both dtypes see the same machine state
                tree = _random_tree(rng, T, lm.vocab_size)
                t0 = time.perf_counter()
                forward_tree(lm.model, caches[dt], tree, args.context, lm.device, lm.dtype).argmax(-1).tolist()
                if rep:
                    times[(dt, T)].append((time.perf_counter() - t0) * 1e3)
                caches[dt].crop(-T)
    print(f"verify forward, context {args.context}, {torch.get_num_threads()} threads, median of {args.repeats} (ms)\n")
    print("| T | float32 | bfloat16 | fp32 / bf16 | t(T)/t(1) fp32 |")
    print("|---|---|---|---|---|")
    base = statistics.median(times[("float32", sizes[0])])
    for T in sizes:
        a, b = statistics.median(times[("float32", T)]), statistics.median(times[("bfloat16", T)])
        print(f"| {T} | {a:.1f} | {b:.1f} | {a / b:.2f} | {a / base:.2f} |")


if __name__ == "__main__":
    main()
