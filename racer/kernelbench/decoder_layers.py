"""Verify-forward time against tree size with transformers' decoder-layer modules and with
racer.cpu.layers' forward (same kernels, same bits, no module tree), interleaved in one run:

    python -m racer.kernelbench.decoder_layers [--context 600] [--repeats 9] [--sizes 1,2,4,8,16,32] [--dtype float32]

Prints a markdown table of median ms, module / fast (>1: the fast forward faster) and t(T)/t(1).
"""
from __future__ import annotations

from typing import Callable

from ..cpu import ON, layers
from ..models import load_model
from .timing import ab_title, parse_args, print_table, time_forwards

FAST = "fast layers"


def _use(on: bool) -> Callable[[], None]:
    def switch() -> None:
        ON.fast_layer = on
    return switch


def main() -> None:
    args, sizes = parse_args(__doc__, repeats=9, sizes="1,2,4,8,16,32", context=600, dtype=True)
    lm = load_model(args.model, device="cpu", dtype=args.dtype)
    if not layers.count(lm.model):
        raise SystemExit("this model's layers have no fast forward here (needs racer's tiled kernel)")
    was = ON.fast_layer
    try:
        med = time_forwards({"module": (lm, _use(False)), FAST: (lm, _use(True))}, sizes, args.context, args.repeats)
    finally:
        ON.fast_layer = was
    print_table(med, "module", [FAST], sizes,
                ab_title(lm, args, "module / fast > 1: racer's decoder-layer forward faster (bit-identical logits)"))


if __name__ == "__main__":
    main()
