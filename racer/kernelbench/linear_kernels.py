"""Verify-forward time against tree size for each of racer.cpu.linear's kernels (stock,
small-batch, packed, tiled), interleaved in one run on one model:

    python -m racer.kernelbench.linear_kernels [--context 300] [--repeats 12] [--sizes 1,2,4,8,16,32,64] [--dtype float32]

Prints a markdown table of median ms, stock / kernel (>1: the kernel is faster) and t(T)/t(1).
Kernels this build or CPU cannot run in the dtype are left out.
"""
from __future__ import annotations

import torch

from ..cpu.linear import available, use_kernel
from ..models import load_model
from .timing import parse_args, print_table, time_forwards


def main() -> None:
    args, sizes = parse_args(__doc__, repeats=12, sizes="1,2,4,8,16,32,64", dtype=True)
    lm = load_model(args.model, device="cpu", dtype=args.dtype, linear_kernel="stock")
    kernels = ["stock"] + [k for k in available(lm.dtype) if k != "stock"]
    # keep_packed: switching back and forth must not re-pack the weights every round.
    variants = {k: (lm, lambda k=k: use_kernel(lm.model, k, keep_packed=True)) for k in kernels}
    med = time_forwards(variants, sizes, args.context, args.repeats)
    dt = str(lm.dtype).replace("torch.", "")
    print_table(med, "stock", kernels[1:], sizes,
                f"verify forward, {lm.name} {dt}, context {args.context}, {torch.get_num_threads()} threads, "
                f"median of {args.repeats} (ms); stock / kernel > 1: the kernel is faster")


if __name__ == "__main__":
    main()
