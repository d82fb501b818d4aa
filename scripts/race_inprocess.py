"""The app's race handler called in one process, no HTTP and no page: what the race reports when
only its own frame-building runs beside it (compare scripts/race_check.py, the same through the
server).

    .venv/bin/python scripts/race_inprocess.py                    # Extract to JSON, 128 tokens, 3 races
    .venv/bin/python scripts/race_inprocess.py --no-gc            # the garbage collector off throughout
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--example", default="Extract to JSON")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--races", type=int, default=3)
    ap.add_argument("--no-gc", action="store_true")
    args = ap.parse_args()
    from race_check import LANES, parse_race, settings

    from racer import load_model
    from racer.costcurve import get_cost_curve
    from racer_app.handlers import Studio
    from racer_app.models import ModelStore
    from racer_app.session import Session
    lm = load_model("default")
    get_cost_curve(lm)
    if args.no_gc:
        gc.disable()
    studio = Studio(ModelStore(lm))
    ex = {e["title"]: e for e in json.loads((ROOT / "assets" / "examples.json").read_text())}[args.example]
    for _ in range(args.races):
        frame = None
        for frame in studio.race(Session(), 0, ex["prompt"], ex.get("system", ""), *settings(args.max_new_tokens)):
            pass
        print(json.dumps(parse_race(str(frame[8]), {m: str(frame[1 + 2 * k]) for k, m in enumerate(LANES)})),
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
