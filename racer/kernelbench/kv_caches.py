"""Verify-forward time against tree size with transformers' DynamicCache (appends by
concatenation) and racer.kvcache.GrowingCache (appends in place), interleaved in one run:

    python -m racer.kernelbench.kv_caches [--context 1000] [--repeats 9] [--sizes 1,2,4,8,16,32]

Prints a markdown table of median ms, dynamic / growing (>1: growing faster) and t(T)/t(1).
"""
from __future__ import annotations

from transformers import DynamicCache

from ..models import load_model
from .timing import ab_title, parse_args, print_table, time_forwards


def main() -> None:
    args, sizes = parse_args(__doc__, repeats=9, sizes="1,2,4,8,16,32", context=1000)
    lm = load_model(args.model, device="cpu", dtype="float32")
    variants = {"dynamic": (lm, lambda: None), "growing": (lm, lambda: None)}
    med = time_forwards(variants, sizes, args.context, args.repeats,
                        cache_for={"dynamic": lambda m: DynamicCache(config=m.config)})
    print_table(med, "dynamic", ["growing"], sizes,
                ab_title(lm, args, "dynamic / growing > 1: the in-place cache is faster"))


if __name__ == "__main__":
    main()
