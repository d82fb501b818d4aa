"""Verify-forward ms with another checkout's kernel build against this checkout's, in one process:
both builds are loaded, and every round times the same random tree with each in turn, so both see
the same machine state (scripts/forward_curve.py compares checkouts in separate processes, minutes
apart, which a shared host's drift of 20-30 % swamps).

    git worktree add /tmp/before HEAD~1
    .venv/bin/python scripts/kernel_ab.py /tmp/before                       # context 300
    .venv/bin/python scripts/kernel_ab.py /tmp/before --context 800 --dtype float32

The other checkout's kernels are built (once, into the racer cache) if they are not yet. Switched:
what the decoder layers call through their plan (rotary embedding, RMSNorm) and the bfloat16 step
attention, and in float32 the linear products (the tiled kernel multiplies the weights as they are).
Not switched: the bfloat16 linear products (bound when the model loads, on weights packed for this
build) and the final norm, so a change to those cannot be compared this way.
"""
from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def other_build(checkout: Path):  # -> the other checkout's compiled kernels module
    from racer.cpu.build import compile_kernels
    return compile_kernels(checkout / "racer" / "cpu" / "csrc")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("other", help="the other checkout (its racer/cpu/csrc is built and loaded)")
    ap.add_argument("--model", default="default")
    ap.add_argument("--dtype", default=None, help="default: this CPU's fast dtype")
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=24)
    ap.add_argument("--sizes", default="1,4,8,12,16")
    args = ap.parse_args()
    out: list[str] = []

    def work() -> None:
        # As in the app: the model loads and computes on one thread (docs/PERFORMANCE.md §8).
        from racer import load_model
        from racer.cpu import attention, build, layers, linear
        from racer.kernelbench.timing import time_forwards

        old = other_build(Path(args.other))
        lm = load_model(args.model, dtype=args.dtype) if args.dtype else load_model(args.model)
        new = build.extension()
        plans = layers.plans(lm.model)
        if not plans:
            raise SystemExit("this model runs no racer decoder layers: nothing to switch")

        def use(ops):
            def switch() -> None:
                for p in plans:
                    p.ops = ops
                    if p.dtype == torch.float32:
                        p.linear = ops.tiled_linear
                attention._step_ops = lambda *dtype: ops
                if lm.dtype == torch.float32:
                    # The output projection (and any layer outside a plan) asks for the kernels at each call.
                    linear.extension = lambda: ops
            return switch

        sizes = [int(s) for s in args.sizes.split(",")]
        med = time_forwards({"other": (lm, use(old)), "this": (lm, use(new))}, sizes, args.context, args.repeats)
        out.append(f"{lm.name} {str(lm.dtype).replace('torch.', '')}, context {args.context}, median ms of "
                   f"{args.repeats} interleaved rounds, {args.other} -> {ROOT}:")
        out.append("| T | " + " | ".join(str(T) for T in sizes) + " |")
        out.append("|---" * (len(sizes) + 1) + "|")
        out.append("| other | " + " | ".join(f"{med[('other', T)]:.2f}" for T in sizes) + " |")
        out.append("| this | " + " | ".join(f"{med[('this', T)]:.2f}" for T in sizes) + " |")
        out.append("| other / this | " + " | ".join(f"{med[('other', T)] / med[('this', T)]:.3f}x" for T in sizes)
                   + " |")

    t = threading.Thread(target=work)
    t.start()
    t.join()
    print("\n".join(out))
    return 0 if out else 1


if __name__ == "__main__":
    raise SystemExit(main())
