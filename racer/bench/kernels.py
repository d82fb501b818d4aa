"""Verify-forward time against tree size with PyTorch's stock linear kernel and with
racer.fastlinear's small-batch kernel, interleaved in one run on one model:

    python -m racer.bench.kernels [--context 300] [--repeats 12] [--sizes 1,2,4,8,16,32,64] [--dtype float32]

Prints a markdown table of median ms and the stock / small-batch ratio (>1: small-batch faster).
"""
from __future__ import annotations

import argparse

import torch

from ..fastlinear import use_small_batch_linear, use_stock_linear
from ..models import load_model
from .forwardtimes import print_table, time_forwards


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="default")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=12)
    ap.add_argument("--sizes", default="1,2,4,8,16,32,64")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
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
