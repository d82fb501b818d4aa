"""What each of racer's CPU kernel families buys inside a whole verify step: the forward plus the
loop's per-row argmax and top-k (K = 8 with probabilities), with every family on, then with one
family switched off at a time (racer.cpu.switches), interleaved in one run on one model:

    python -m racer.kernelbench.switches [--context 600] [--repeats 8] [--sizes 1,4,8,16] [--dtype float32]

Prints a markdown table of median ms and, per family, off / all-on (>1: the family saves time).
Families whose kernel does not run on this CPU or dtype are left out (the linear kernels have
their own table: racer.kernelbench.linear_kernels).
"""
from __future__ import annotations

from typing import Callable

import torch

from ..cpu import ON, attention, layers
from ..cpu.build import extension
from ..cpu.rows import argmax, top_k
from ..models import load_model
from .timing import ab_title, parse_args, time_forwards

ALL = "all on"
FAMILIES = ("norm", "fast_layer", "silu_mul", "step_attention", "rows")


def _only_off(family: str | None) -> Callable[[], None]:
    def switch() -> None:
        for f in FAMILIES:
            setattr(ON, f, f != family)
    return switch


def _step_rows(logits: torch.Tensor) -> object:
    return argmax(logits).tolist(), top_k(logits, 8, True)


def main() -> None:
    args, sizes = parse_args(__doc__, repeats=8, sizes="1,4,8,16", context=600, dtype=True)
    lm = load_model(args.model, device="cpu", dtype=args.dtype)
    if extension() is None:
        raise SystemExit("racer's CPU kernels do not build here: nothing to switch off")
    families = {"norm": "RMSNorm kernel off", "rows": "row kernel off"}
    if layers.count(lm.model):
        families["fast_layer"] = "fast layer off"
    if layers.silu_mul_count(lm.model):
        families["silu_mul"] = "silu * up kernel off"
    if lm.dtype == torch.bfloat16 and attention.step_kernel_available():
        families["step_attention"] = "step attention off"
    variants = {ALL: (lm, _only_off(None))} | {label: (lm, _only_off(f)) for f, label in families.items()}
    saved = {f: getattr(ON, f) for f in FAMILIES}
    try:
        med = time_forwards(variants, sizes, args.context, args.repeats, read=_step_rows)
    finally:
        for f, v in saved.items():
            setattr(ON, f, v)
    # Shown as off / on: the base column is each switched-off variant, so > 1 means the family saves time.
    print(ab_title(lm, args, "verify forward + argmax + top-8 with probabilities; 'X off' / 'all on' > 1: the "
                             "family saves that much"))
    print()
    names = list(variants)
    print("| T | " + " | ".join(names) + " | " + " | ".join(f"{n} / {ALL}" for n in names[1:]) + " |")
    print("|---" * (2 * len(names)) + "|")
    for T in sizes:
        cells = [f"{med[(n, T)]:.1f}" for n in names] + [f"{med[(n, T)] / med[(ALL, T)]:.2f}" for n in names[1:]]
        print(f"| {T} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
