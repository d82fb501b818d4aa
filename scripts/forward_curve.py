"""Median verify-forward ms per tree size for the checkout this script sits in, as one JSON line:
run it from two checkouts in turn to compare kernels that cannot share a process (each checkout
builds its own kernels). Random trees, the default model, racer's kernels as `load_model` sets them.

    .venv/bin/python scripts/forward_curve.py                       # context 300, 12 rounds
    git worktree add /tmp/before HEAD~1 && ln -s "$PWD/.venv" /tmp/before/.venv
    for i in 1 2 3; do (cd /tmp/before && .venv/bin/python scripts/forward_curve.py); \\
        .venv/bin/python scripts/forward_curve.py; done
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=12)
    ap.add_argument("--sizes", default="1,2,4,6,8,10,12,16,24,32")
    args = ap.parse_args()
    from racer import load_model
    from racer.kernelbench.timing import time_forwards

    lm = load_model(args.model)
    sizes = [int(s) for s in args.sizes.split(",")]
    med = time_forwards({"x": (lm, lambda: None)}, sizes, args.context, args.repeats)
    print(json.dumps({"checkout": str(ROOT), "dtype": str(lm.dtype).replace("torch.", ""),
                      "ms": {T: round(med[("x", T)], 3) for T in sizes}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
