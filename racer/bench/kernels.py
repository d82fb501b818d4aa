"""Verify-forward time against tree size with PyTorch's stock linear kernel and with
racer.fastlinear's small-batch kernel, interleaved in one run on one model:

    python -m racer.bench.kernels [--context 300] [--repeats 12] [--sizes 1,2,4,8,16,32,64] [--dtype float32]

Prints a markdown table of median ms and the stock / small-batch ratio (>1: small-batch faster).
"""
from __future__ import annotations

import torch

from ..fastlinear import use_small_batch_linear, use_stock_linear
from ..models import load_model
from .forwardtimes import parse_args, print_table, time_forwards


def main() -> None:
    args, sizes = parse_args(__doc__, repeats=12, sizes="1,2,4,8,16,32,64", dtype=True)
    lm = load_model(args.model, device="cpu", dtype=args.dtype)
    variants = {"stock": (lm, lambda: use_stock_linear(lm.model)),
                "small-batch": (lm, lambda: use_small_batch_linear(lm.model))}
    med = time_forwards(variants, sizes, args.context, args.repeats)
    dt = str(lm.dtype).replace("torch.", "")
    print_table(med, "stock", "small-batch", sizes,
                f"verify forward, {lm.name} {dt}, context {args.context}, {torch.get_num_threads()} threads, "
                f"median of {args.repeats} (ms); stock / small-batch > 1: small-batch faster")


if __name__ == "__main__":
    main()
