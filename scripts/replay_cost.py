"""What replaying a trace costs against keeping the drafter's state at every step (the choice
behind racer.replay), measured on traces of real runs.

    .venv/bin/python scripts/replay_cost.py                       # the shipped example traces
    .venv/bin/python scripts/replay_cost.py --trace my.json.gz    # any exported trace
    .venv/bin/python scripts/replay_cost.py --example "Open brainstorming" --max-new-tokens 512   # record one first

Per trace: replaying to its last step (median of 5), per step; what the inspector's anatomy of the
last forwarded step costs with its replay (the what-if table and "why missed" included); the memory of the drafter and
sizer at the last step (what a copy per step would cost, each step) against what the records
add for the replay (top-k rows and the start record), per step.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", action="append", help="trace files (default: the shipped ones)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--example", help="record this shipped example with the default model first (capacity auto)")
    ap.add_argument("--max-new-tokens", type=int, default=512)
    args = ap.parse_args()
    from racer_app import tracefile
    from racer_app.memsize import deep_size

    paths = [Path(p) for p in args.trace] if args.trace else [p for _, p in tracefile.shipped()]
    if args.example:
        paths = [record(args.example, args.max_new_tokens)]
    from racer_app.anatomy_view import step_anatomy
    print("| trace | steps | replay to the last step (ms) | per step (ms) | the inspector's anatomy of the last step, "
          "replay included (ms) | drafter + sizer state (KB) | replay data per step (KB) | trace file (KB) |")
    print("|---|---|---|---|---|---|---|---|")
    for path in paths:
        tr = tracefile.load(path)
        rep = tr.replay()
        times = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            state = rep.before(tr.n - 1)
            times.append((time.perf_counter() - t) * 1e3)
        ms = statistics.median(times)
        # What the inspector does for a step: replay, the what-if table, why missed, the stages.
        last = max(k for k, st in enumerate(tr.steps) if st.forwarded)
        an_ms = statistics.median(step_anatomy(None, tr, last).replay_ms for _ in range(args.repeats))
        state_kb = deep_size([state.drafter, state.sizer]) / 1024
        extra = sum(deep_size([s.topk, s.topk_p]) for s in tr.steps) + deep_size([t.start for t in tr.turns])
        print(f"| {tr.title} | {tr.n} | {ms:.1f} | {ms / tr.n:.2f} | {an_ms:.0f} | {state_kb:,.0f} | "
              f"{extra / tr.n / 1024:.2f} | {path.stat().st_size / 1024:.0f} |")
    return 0


def record(title: str, max_new: int) -> Path:
    """A trace of one shipped example on the default model, recorded as the app records a race."""
    import tempfile

    from racer import DecodeConfig, DecodeRun, build_input_ids, load_model, make_drafter
    from racer.replay import Turn
    from racer_app import tracefile
    from racer_app.handlers import Studio, load_examples
    from racer_app.models import ModelStore
    from racer_app.settings import make_sizer, racer_options
    lm = load_model("default")
    studio = Studio(ModelStore(lm))
    ex = {e["title"]: e for e in load_examples()}[title]
    s = studio.defaults
    ids = build_input_ids(lm.tokenizer, ex["prompt"], system=ex.get("system") or None)
    run = DecodeRun(lm, ids, make_drafter("racer", vocab_size=lm.vocab_size, **racer_options(s)),
                    DecodeConfig(max_new_tokens=max_new, capacity="auto", detail=True), sizer=make_sizer(lm))
    steps = list(run)
    trace = studio.trace_from(lm, steps, ids, "race", title, s, run.result.stop_reason, [Turn(run.start, steps)],
                              run.sizer)
    return tracefile.save(trace, Path(tempfile.mkdtemp()) / "recorded.json.gz")


if __name__ == "__main__":
    sys.exit(main())
