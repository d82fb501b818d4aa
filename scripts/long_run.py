"""Long run: one generation of the full context length with a small automaton, so that
eviction runs constantly; samples RSS and automaton size every N steps and checks both stay flat.

    .venv/bin/python scripts/long_run.py                    # tiny model, context 2048, automaton 500
    .venv/bin/python scripts/long_run.py --context 1024 --capacity 200 --every 50

Sampling (temperature 1.5) keeps the text varied, so new n-grams arrive every step and the
automaton must evict to make room. Prints the curve as a table and a JSON line; exits 1 if
the automaton ever exceeds its capacity, is not at capacity for the second half, or RSS grows
more than --rss-slack MB over the second half.
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--capacity", type=int, default=500, help="automaton capacity (nodes)")
    ap.add_argument("--every", type=int, default=100, help="sample every N steps")
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=1.5)
    ap.add_argument("--rss-slack", type=float, default=16.0, help="MB of growth allowed over the second half")
    args = ap.parse_args()

    import psutil
    import torch
    torch.set_num_threads(1)
    from racer import DecodeConfig, DecodeRun, make_drafter
    from racer.tiny import tiny_lm

    lm = tiny_lm(vocab=96, max_context=args.context)
    proc = psutil.Process()
    drafter = make_drafter("racer", vocab_size=lm.vocab_size, capacity_automaton=args.capacity, window=10)
    prompt = [(7 * i) % 96 for i in range(args.prompt_tokens)]
    cfg = DecodeConfig(max_new_tokens=args.context, capacity=16, temperature=args.temperature, seed=1, detail=False)
    run = DecodeRun(lm, prompt, drafter, cfg)
    rows = []
    evictions = 0
    over = 0
    t0 = time.perf_counter()
    tokens = 0
    for k, rec in enumerate(run):
        tokens += len(rec.committed)
        evictions += len((rec.info or {}).get("evicted") or [])
        size = len(drafter.automaton)
        over += size > args.capacity
        if k % args.every == 0:
            gc.collect()
            rows.append({"step": k, "tokens": tokens, "context": len(prompt) + tokens, "automaton": size,
                         "evictions": evictions, "rss_mb": round(proc.memory_info().rss / 2**20, 1),
                         "s": round(time.perf_counter() - t0, 1)})
    res = run.result
    gc.collect()
    rows.append({"step": res.steps, "tokens": tokens, "context": len(prompt) + tokens, "automaton": len(drafter.automaton),
                 "evictions": evictions, "rss_mb": round(proc.memory_info().rss / 2**20, 1),
                 "s": round(time.perf_counter() - t0, 1)})
    drafter.automaton.check_invariants()

    print(f"{'step':>6} {'tokens':>7} {'context':>8} {'automaton':>10} {'evictions':>10} {'rss MB':>8} {'s':>6}")
    for r in rows:
        print(f"{r['step']:>6} {r['tokens']:>7} {r['context']:>8} {r['automaton']:>10} {r['evictions']:>10} "
              f"{r['rss_mb']:>8} {r['s']:>6}")
    half = rows[len(rows) // 2:]
    rss_growth = max(r["rss_mb"] for r in half) - half[0]["rss_mb"]
    at_cap = all(r["automaton"] == args.capacity for r in half)
    summary = {"context": args.context, "automaton_capacity": args.capacity, "new_tokens": res.new_tokens,
               "steps": res.steps, "stop_reason": res.stop_reason, "evictions": evictions,
               "evictions_per_step": round(evictions / max(1, res.steps), 2), "over_capacity_steps": over,
               "at_capacity_second_half": at_cap, "rss_growth_second_half_mb": round(rss_growth, 1),
               "rss_mb_first": rows[0]["rss_mb"], "rss_mb_last": rows[-1]["rss_mb"],
               "wall_s": round(time.perf_counter() - t0, 1)}
    ok = over == 0 and at_cap and rss_growth <= args.rss_slack and res.stop_reason == "context_limit"
    summary["passed"] = ok
    print(json.dumps(summary))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
