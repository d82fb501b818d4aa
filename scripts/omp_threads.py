"""Why the server runs every forward on one thread (racer_app/decodethreads.py): the same `ar`
forward timed from the thread that loaded the model, from a second thread while the first keeps
its OpenMP pool, and from a decode slot's thread when no other thread has run a parallel region.

    .venv/bin/python scripts/omp_threads.py                # default model, 3 rounds of 48 forwards each
    OMP_WAIT_POLICY=PASSIVE .venv/bin/python scripts/omp_threads.py   # every thread sleeps: all slow

Prints the median forward ms per round for each case. The first two run in this process; the
third in a fresh one (`--slot-only`), whose main thread never computes.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def forward_ms(lm, ids, n: int) -> float:
    from racer import DecodeConfig, DecodeRun, make_drafter
    run = DecodeRun(lm, ids, make_drafter("ar"), DecodeConfig(max_new_tokens=n))
    return statistics.median(r.timings["forward_ms"] for r in run if r.forwarded)


def on_thread(fn, *args):
    out = []
    t = threading.Thread(target=lambda: out.append(fn(*args)))
    t.start()
    t.join()
    return out[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--slot-only", action="store_true", help="only the decode slot's thread (run by the default)")
    args = ap.parse_args()
    from racer import build_input_ids, load_model
    prompt = "List the planets of the solar system, one per line, with one fact about each."
    if args.slot_only:
        from racer_app.decodethreads import DecodeSlots
        slots = DecodeSlots(1)
        lm = slots.call(load_model, "default")
        ids = build_input_ids(lm.tokenizer, prompt)
        for _ in range(args.rounds):
            print(f"{slots.call(forward_ms, lm, ids, args.tokens):.2f}", flush=True)
        return 0
    lm = load_model("default")
    ids = build_input_ids(lm.tokenizer, prompt)
    print(f"{lm.name}, {str(lm.dtype).replace('torch.', '')}, median ar forward ms per round of {args.tokens}")
    rows: dict[str, list[float]] = {"the loading thread": [], "a second thread": []}
    for _ in range(args.rounds):
        rows["the loading thread"].append(forward_ms(lm, ids, args.tokens))
        rows["a second thread"].append(on_thread(forward_ms, lm, ids, args.tokens))
    out = subprocess.run([sys.executable, __file__, "--slot-only", "--rounds", str(args.rounds), "--tokens",
                          str(args.tokens)], capture_output=True, text=True, check=True).stdout
    rows["a decode slot's thread, alone (fresh process)"] = [float(x) for x in out.split()]
    for k, v in rows.items():
        print(f"| {k} | {', '.join(f'{x:.1f}' for x in v)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
