"""Verify-forward time against tree size in float32 and bfloat16, interleaved in one run:

    python -m racer.kernelbench.dtypes [--context 300] [--repeats 9] [--sizes 1,8,16,32,64]

Prints a markdown table of median ms and the float32/bfloat16 ratio (>1: bfloat16 faster).
"""
from __future__ import annotations

import torch

from ..models import load_model
from .timing import parse_args, print_table, time_forwards


def main() -> None:
    args, sizes = parse_args(__doc__, repeats=9, sizes="1,8,16,32,64")
    variants = {dt: (load_model(args.model, device="cpu", dtype=dt), lambda: None) for dt in ("float32", "bfloat16")}
    med = time_forwards(variants, sizes, args.context, args.repeats)
    print_table(med, "bfloat16", ["float32"], sizes,
                f"verify forward, context {args.context}, {torch.get_num_threads()} threads, "
                f"median of {args.repeats} (ms); bfloat16 / float32 > 1: float32 faster")


if __name__ == "__main__":
    main()
