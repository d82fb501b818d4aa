"""Which clock should the race use? Candidate clocks computed from the same recorded races, in
one process, on a quiet machine and under two kinds of load:

    .venv/bin/python scripts/race_clocks.py                       # Summarise a passage, 128 tokens, 4 races per load
    .venv/bin/python scripts/race_clocks.py --races 6 --loads quiet,process

Loads: quiet (one series before the loads, one after: the machine drifts); process (a busy-loop process takes one of the cores for the whole race); light (a
process busy 5 ms in every 20: a neighbour's light load, which slows most forwards by 20-50 %,
under the curve's 1.5x line); render (a
thread of this process builds and serialises plotly figures, as another visitor's inspector does
in the app's server, sharing the interpreter lock). Clocks, each RACER's speed-up over plain
decoding from the same steps (`Lane.charges`):
  wall     every step its wall time;
  trimmed  a forward above 1.5x its lane's median (measured / cost curve) charged that median;
  model    every forward charged its lane's median x the cost curve, the rest at wall time;
  quiet    what racer.race charges: a forward above SLOWED (1.25) x its quiet estimate (the curve x
           the method's quiet level, learnt from quiet races) or above 1.5x the curve charged that
           estimate, its whole step alike; the rest at wall time;
  curve    the same with the curve's 1.5x line alone (racer.race before SLOWED);
  fwd      as quiet, but only the disturbed forward is replaced by its quiet estimate; the rest of
           its step stays at wall time;
  cpu      the CPU time of the decoding thread (time.thread_time around each step).
Prints the speed-up of every race, the median and the spread (max - min over the median).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]
from race_check import DEFAULT_EXAMPLE  # noqa: E402 - the example race_check runs

#: The light load: busy 5 ms, then asleep 15.
LIGHT = ("import time\nwhile True:\n    t = time.perf_counter()\n    while time.perf_counter() - t < 0.005: pass\n"
         "    time.sleep(0.015)")
CLOCKS = ("wall", "trimmed", "model", "quiet", "curve", "fwd", "cpu")


def lane_seconds(charges: list[tuple[float, float, float, float | None]], cpu: list[float],
                 prefill_s: float, level: float | None) -> dict[str, float]:
    ratios = [f / e for _, _, f, e in charges if e and f > 0]
    quiet, level = level, statistics.median(ratios) if ratios else 1.0
    wall = sum(dt for _, dt, _, _ in charges)
    trimmed = sum(dt - ((f - level * e) / 1e3 if e and f > 1.5 * level * e else 0.0) for _, dt, f, e in charges)
    model = sum(dt - (f - level * e) / 1e3 if e else dt for _, dt, f, e in charges)
    fwd = sum(dt - (f - level * e) / 1e3 if level and e and f > 1.5 * e else dt for _, dt, f, e in charges)
    curve = sum(dt * min(1.0, quiet * e / f) if quiet and e and f > 1.5 * e else dt for _, dt, f, e in charges)
    return {"wall": wall, "trimmed": trimmed, "model": model, "quiet": sum(c for c, _, _, _ in charges),
            "curve": curve, "fwd": fwd,
            # The first step ran the prefill too: its CPU time is split in the proportion of its wall time.
            "cpu": sum(cpu[1:]) + (cpu[0] * charges[0][1] / (charges[0][1] + prefill_s) if cpu and charges else 0.0)}


class CpuTimed:
    """A drafter's DecodeRun iterator wrapped so each step's thread CPU time adds up (the `cpu` clock)."""

    def __init__(self) -> None:
        self.s: dict[str, list[float]] = {}

    def wrap(self, race) -> None:
        for m, lane in race.lanes.items():
            run, timed = lane.run, self

            class Run:
                def __iter__(self, run=run, m=m):
                    it = iter(run)
                    while True:
                        t = time.thread_time()
                        try:
                            rec = next(it)
                        except StopIteration:
                            return
                        timed.s.setdefault(m, []).append(time.thread_time() - t)
                        yield rec

                def __getattr__(self, name, run=run):
                    return getattr(run, name)
            lane.run = Run()


def render_load(halt: threading.Event) -> None:
    import numpy as np
    import plotly.graph_objects as go
    while not halt.is_set():
        go.Figure([go.Scatter(x=np.arange(300), y=np.random.rand(300), mode="markers+text",
                              text=[str(i) for i in range(300)]) for _ in range(4)]).to_json()
        time.sleep(0.02)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--example", default=DEFAULT_EXAMPLE)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--races", type=int, default=4)
    ap.add_argument("--loads", default="quiet,process,render")
    args = ap.parse_args()
    from racer import DecodeConfig, build_input_ids, load_model, make_drafter
    from racer.costcurve import get_cost_curve
    from racer.race import Race
    from racer.sizing import Sizer

    lm = load_model("default")
    curve = get_cost_curve(lm)
    ex = {e["title"]: e for e in json.loads((ROOT / "assets" / "examples.json").read_text())}[args.example]
    ids = build_input_ids(lm.tokenizer, ex["prompt"], system=ex.get("system") or None)
    print(f"{args.example}, {args.max_new_tokens} new tokens, {args.races} races per load")
    print("| load | clock | RACER × per race | median | spread |\n|---|---|---|---|---|")
    loads = args.loads.split(",")
    if loads[0] == "quiet" and len(loads) > 1 and loads[-1] != "quiet":
        loads.append("quiet")
    for load in loads:
        halt, proc = threading.Event(), None
        if load == "process":
            proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        elif load == "light":
            proc = subprocess.Popen([sys.executable, "-c", LIGHT])
        elif load == "render":
            threading.Thread(target=render_load, args=(halt,), daemon=True).start()
        try:
            ups: dict[str, list[float]] = {c: [] for c in CLOCKS}
            for _ in range(args.races):
                race = Race(lm, ids, {m: make_drafter(m, vocab_size=lm.vocab_size) for m in ("racer", "ar", "tr")},
                            DecodeConfig(max_new_tokens=args.max_new_tokens, capacity="auto"),
                            run_kwargs={m: {"sizer": Sizer(curve)} for m in ("racer", "tr")})
                cpu = CpuTimed()
                cpu.wrap(race)
                for _ in race:
                    pass
                secs = {m: lane_seconds(ln.charges, cpu.s.get(m, []), ln.prefill_s, race.level(m))
                        for m, ln in race.lanes.items()}
                for c in CLOCKS:
                    ups[c].append((race.lanes["racer"].n_tokens / secs["racer"][c])
                                  / (race.lanes["ar"].n_tokens / secs["ar"][c]))
        finally:
            halt.set()
            if proc is not None:
                proc.kill()
        for c in CLOCKS:
            xs = ups[c]
            med = statistics.median(xs)
            print(f"| {load} | {c} | {', '.join(f'{x:.2f}' for x in xs)} | {med:.2f} | {(max(xs) - min(xs)) / med:.2f} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
