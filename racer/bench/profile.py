"""Where one decoding step's time goes, per method, on real prompts:

    python -m racer.bench.profile [--methods ar,pld,tr,racer] [--capacity auto] [--per-category 1]
                                  [--max-new-tokens 128] [--data assets/bench_prompts.jsonl]

Runs the methods interleaved per prompt through the decode loop and prints the median and mean
ms per step of each phase: draft (for racer split into automaton / logits tree / merge), sizing,
mask building (timed again on the step's own tree: it happens inside the forward), forward,
verify (argmax + top-k), cache update, drafter update, and the loop's Python overhead (the
step's wall time minus the timed phases).
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

import torch

from ..coldrows import get_cold_rows
from ..drafters import make_drafter
from ..loop import DecodeConfig, DecodeRun
from ..models import load_model
from ..prompting import build_input_ids
from .data import load_rows
from .runner import parse_capacity

PHASES = ("draft_ms", "automaton_ms", "logits_ms", "merge_ms", "sizing_ms", "mask_ms", "forward_ms",
          "verify_ms", "cache_ms", "update_ms", "overhead_ms", "step_ms")


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="default")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--data", default="assets/bench_prompts.jsonl")
    ap.add_argument("--per-category", type=int, default=1)
    ap.add_argument("--methods", default="ar,pld,tr,racer")
    ap.add_argument("--capacity", type=parse_capacity, default="auto")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args()
    lm = load_model(args.model, device="cpu", dtype=args.dtype)
    get_cold_rows(lm)  # as the benchmark does: racer drafts from them where the root has no row
    rows, _ = load_rows(args.data, per_category=args.per_category, turns="first")
    cfg = DecodeConfig(max_new_tokens=args.max_new_tokens, capacity=args.capacity)
    per: dict[str, dict[str, list[float]]] = {m: defaultdict(list) for m in args.methods.split(",")}
    tokens: dict[str, int] = defaultdict(int)
    for row in rows:
        ids = build_input_ids(lm.tokenizer, row.turns[0])
        for method, acc in per.items():  # interleaved per prompt
            run = DecodeRun(lm, ids, make_drafter(method, vocab_size=lm.vocab_size), cfg)
            last = time.perf_counter()
            for rec in run:
                now = time.perf_counter()
                if not rec.forwarded:
                    last = now
                    continue
                t = dict(rec.timings)
                t.update(rec.info.get("draft_breakdown", {}))
                t0 = time.perf_counter()
                if not rec.tree.is_chain():
                    rec.tree.attention_mask(rec.context_len, lm.dtype, lm.device)
                    rec.tree.position_ids(rec.context_len, lm.device)
                t["mask_ms"] = (time.perf_counter() - t0) * 1e3
                if rec.index > 0:  # the first step's wall time also holds the prefill
                    t["step_ms"] = (now - last) * 1e3
                    timed = sum(t.get(k, 0.0) for k in ("draft_ms", "sizing_ms", "forward_ms", "verify_ms",
                                                          "cache_ms", "update_ms"))
                    t["overhead_ms"] = t["step_ms"] - timed
                for k in PHASES:
                    if k in t:
                        acc[k].append(t[k])
                last = time.perf_counter()  # the mask re-timing above is not part of the next step
            tokens[method] += run.result.new_tokens if run.result else 0
    dt = str(lm.dtype).replace("torch.", "")
    print(f"{lm.name} {dt}, {torch.get_num_threads()} threads, {len(rows)} prompts, "
          f"{args.max_new_tokens} new tokens, capacity {args.capacity}: median / mean ms per step\n")
    print("| phase | " + " | ".join(per) + " |")
    print("|---|" + "---|" * len(per))
    for k in PHASES:
        cells = []
        for m in per:
            v = per[m].get(k)
            cells.append(f"{statistics.median(v):.2f} / {statistics.mean(v):.2f}" if v else "–")
        print(f"| {k.removesuffix('_ms')} | " + " | ".join(cells) + " |")
    print("| steps | " + " | ".join(str(len(per[m]["step_ms"])) for m in per) + " |")
    print("| tokens | " + " | ".join(str(tokens[m]) for m in per) + " |")
    print("\nmask is included in forward; automaton / logits / merge are parts of draft.")


if __name__ == "__main__":
    main()
