"""Verify-forward time against tree size with transformers' sdpa attention and with
racer.attention's GQA-packing variant of it, interleaved in one run on one model:

    python -m racer.bench.attention [--context 1500] [--repeats 9] [--sizes 1,2,4,8,16,32] [--dtype float32]

Prints a markdown table of median ms, sdpa / racer_sdpa (>1: racer_sdpa faster) and t(T)/t(1).
The gap grows with the context: what racer_sdpa saves is a copy of the KV cache per layer.
"""
from __future__ import annotations

from typing import Callable

from .. import attention
from ..models import LoadedModel, load_model
from .forwardtimes import ab_title, parse_args, print_table, time_forwards


def _use(lm: LoadedModel, name: str) -> Callable[[], None]:
    def switch() -> None:
        lm.model.config._attn_implementation = name
    return switch


def main() -> None:
    args, sizes = parse_args(__doc__, repeats=9, sizes="1,2,4,8,16,32", context=1500, dtype=True)
    lm = load_model(args.model, device="cpu", dtype=args.dtype)
    variants = {"sdpa": (lm, _use(lm, "sdpa")), attention.NAME: (lm, _use(lm, attention.NAME))}
    try:
        med = time_forwards(variants, sizes, args.context, args.repeats)
    finally:
        lm.model.config._attn_implementation = attention.NAME
    print_table(med, "sdpa", [attention.NAME], sizes,
                ab_title(lm, args, f"sdpa / {attention.NAME} > 1: {attention.NAME} faster"))


if __name__ == "__main__":
    main()
