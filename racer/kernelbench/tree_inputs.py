"""A tree's verify-forward inputs (token ids, positions, the step kernel's visibility, the additive
mask) built by racer's kernel (csrc/tree_inputs.cpp) against numpy and torch, interleaved in one run:

    python -m racer.kernelbench.tree_inputs [--dtype bfloat16] [--context 300] [--repeats 150] [--sizes 2,4,8,12,16]

The variants differ only in RACER_ROW_KERNEL's switch (racer.cpu.switches), read here by the tree
inputs alone: the logits are read back by PyTorch's argmax in both. Prints a markdown table of
median ms per whole verify forward and what the kernel saves.
"""
from __future__ import annotations

from ..cpu import ON
from ..cpu.build import extension
from ..models import load_model
from .timing import ab_title, parse_args, time_forwards


def main() -> None:
    args, sizes = parse_args(__doc__, repeats=150, sizes="2,4,8,12,16", dtype=True)
    lm = load_model(args.model, device="cpu", dtype=args.dtype)
    if extension() is None:
        raise SystemExit("racer's CPU kernels do not build here: nothing to compare")
    saved = ON.rows
    try:
        variants = {"numpy/torch": (lm, lambda: setattr(ON, "rows", False)),
                    "kernel": (lm, lambda: setattr(ON, "rows", True))}
        med = time_forwards(variants, sizes, args.context, args.repeats)
    finally:
        ON.rows = saved
    print(ab_title(lm, args, "random bushy trees; the inputs' cost is what the forward loses without the kernel"))
    print()
    print("| T | numpy/torch | kernel | saved (ms) | numpy/torch / kernel |")
    print("|---|---|---|---|---|")
    for T in sizes:
        a, b = med[("numpy/torch", T)], med[("kernel", T)]
        print(f"| {T} | {a:.2f} | {b:.2f} | {a - b:.3f} | {a / b:.3f} |")


if __name__ == "__main__":
    main()
