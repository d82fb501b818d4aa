"""Does the tree sizer draft the same trees run after run, and beside a busy process? The same
prompt decoded several times with `racer` and capacity `auto`, for each sizer setting given,
printing per run the tokens per forward (MAT), the mean tree size and the decoding tokens/s.

    .venv/bin/python scripts/sizing_jitter.py                              # Extract to JSON, 128 tokens, 3 runs
    .venv/bin/python scripts/sizing_jitter.py --busy                       # ... beside a busy-loop process
    .venv/bin/python scripts/sizing_jitter.py --variants default,cal,cal-learn-busy

Variants: `default` (the library's Sizer), `cal` (calibrate=True), `cal-learn-busy` (calibrate=True,
skip_disturbed=False: the sizer before disturbed forwards were skipped and calibration was off).
Under greedy decoding the output is the same in every run; only the trees, hence MAT and speed,
can differ.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

VARIANTS = {"default": {}, "cal": {"calibrate": True},
            "cal-learn-busy": {"calibrate": True, "skip_disturbed": False}}


def spin() -> None:
    while True:
        pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--example", default="Extract to JSON")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--variants", default="default,cal,cal-learn-busy")
    ap.add_argument("--busy", action="store_true", help="a busy-loop process on one core throughout")
    args = ap.parse_args()
    from racer import DecodeConfig, DecodeRun, build_input_ids, load_model, make_drafter
    from racer.costcurve import get_cost_curve
    from racer.sizing import Sizer
    lm = load_model("default")
    curve = get_cost_curve(lm)
    ex = {e["title"]: e for e in json.loads((ROOT / "assets" / "examples.json").read_text())}[args.example]
    ids = build_input_ids(lm.tokenizer, ex["prompt"], ex.get("system") or None)
    cfg = DecodeConfig(max_new_tokens=args.max_new_tokens, capacity="auto")
    busy = multiprocessing.Process(target=spin, daemon=True) if args.busy else None
    if busy:
        busy.start()
    try:
        rows: dict[str, list[tuple[float, float, float]]] = {}
        for _ in range(args.runs):          # interleaved: every variant sees the same machine state
            for v in args.variants.split(","):
                run = DecodeRun(lm, ids, make_drafter("racer", vocab_size=lm.vocab_size), cfg,
                                sizer=Sizer(curve, **VARIANTS[v]))
                sizes = [len(r.tree) for r in run if r.forwarded]
                res = run.result
                decode_s = res.wall_s - res.prefill_ms / 1e3
                rows.setdefault(v, []).append((len(res.token_ids) / res.forwards, statistics.mean(sizes),
                                               len(res.token_ids) / decode_s))
    finally:
        if busy:
            busy.terminate()
    print(f"{args.example}, {args.max_new_tokens} tokens, {'beside a busy process' if args.busy else 'quiet'}")
    print("| sizer | MAT per run | tree nodes per run | tokens/s per run |")
    print("|---|---|---|---|")
    for v, rs in rows.items():
        print(f"| {v} | {', '.join(f'{m:.2f}' for m, _, _ in rs)} | {', '.join(f'{n:.1f}' for _, n, _ in rs)} | "
              f"{', '.join(f'{t:.0f}' for _, _, t in rs)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
