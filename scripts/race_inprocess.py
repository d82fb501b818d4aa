"""The app's race handler called in one process, no HTTP and no page: what the race reports when
only its own frame-building runs beside it (compare scripts/race_check.py, the same through the
server).

    .venv/bin/python scripts/race_inprocess.py                    # Summarise a passage, 128 tokens, 3 races
    .venv/bin/python scripts/race_inprocess.py --no-gc            # the garbage collector off throughout
    .venv/bin/python scripts/race_inprocess.py --no-frames        # the race alone: no frame built between steps
    .venv/bin/python scripts/race_inprocess.py --no-frames --pause-ms 10   # ... with an idle pause between steps
"""
from __future__ import annotations

import argparse
import functools
import gc
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]
from race_check import DEFAULT_EXAMPLE  # noqa: E402 - the example race_check runs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--example", default=DEFAULT_EXAMPLE)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--races", type=int, default=3)
    ap.add_argument("--no-gc", action="store_true")
    ap.add_argument("--no-frames", action="store_true", help="build no frames while racing (the last one only)")
    ap.add_argument("--pause-ms", type=float, default=0.0, help="with --no-frames: sleep this long between steps")
    args = ap.parse_args()
    from race_check import LANES, parse_race, settings

    from racer.costcurve import get_cost_curve
    from racer_app.handlers import Studio
    from racer_app.models import ModelStore
    from racer_app.session import Session
    # As in the app: the model loads on a thread that then ends, and every computation runs on the
    # decode slot's thread (racer_app/decodethreads.py), never on this one.
    store = ModelStore(start_spec="default")
    store.start(background=True)
    studio = Studio(store)
    lm = store.get("default")
    studio.slots.call(get_cost_curve, lm)
    if args.no_gc:
        gc.disable()
    if args.no_frames:
        studio._race_stream = functools.partial(race_unframed, studio, pause_s=args.pause_ms / 1e3)
    ex = {e["title"]: e for e in json.loads((ROOT / "assets" / "examples.json").read_text())}[args.example]
    for _ in range(args.races):
        frame = None
        for frame in studio.race(Session(), 0, ex["prompt"], ex.get("system", ""), *settings(args.max_new_tokens)):
            pass
        print(json.dumps(parse_race(str(frame[8]), {m: str(frame[1 + 2 * k]) for k, m in enumerate(LANES)})),
              flush=True)
    return 0


def race_unframed(studio: Any, race: Any, lm: Any, status: str, viewport: Any, pause_s: float = 0.0) -> Any:
    """Studio._race_stream without its frames: the race's steps back to back (or `pause_s` apart)."""
    from racer_app.handlers import RACE_METHODS, race_span_builders
    yield studio._race_frame(status=status, lanes=race.lanes, spans={m: [] for m in RACE_METHODS}, running=True)
    steps: dict[str, list[Any]] = {m: [] for m in RACE_METHODS}
    for lane, rec in race:
        steps[lane.method].append(rec)
        if pause_s:
            time.sleep(pause_s)
    builders = race_span_builders(lm)
    for m in RACE_METHODS:
        for rec in steps[m]:
            builders[m].push_step(rec)
    return steps["racer"], steps["tr"], builders


if __name__ == "__main__":
    raise SystemExit(main())
