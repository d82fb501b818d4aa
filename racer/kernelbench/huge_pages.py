"""Verify-forward time with the weights on 2 MiB pages against 4 KiB pages, interleaved in one run:

    python -m racer.kernelbench.huge_pages --dtype bfloat16 [--context 300] [--repeats 60] [--sizes 1,4,8,16]

The model is loaded twice, once with RACER_HUGE_PAGES=0 (racer.cpu.hugepages). Prints a markdown
table of median ms and the ratio 4 KiB / 2 MiB (>1: huge pages faster).
"""
from __future__ import annotations

import os

from ..models import load_model
from .timing import ab_title, parse_args, print_table, time_forwards


def main() -> None:
    args, sizes = parse_args(__doc__, repeats=60, sizes="1,4,8,16", dtype=True)
    variants = {}
    saved = os.environ.get("RACER_HUGE_PAGES")
    try:
        for name, flag in (("4KiB", "0"), ("2MiB", "1")):
            os.environ["RACER_HUGE_PAGES"] = flag
            variants[name] = (load_model(args.model, device="cpu", dtype=args.dtype), lambda: None)
    finally:
        if saved is None:
            os.environ.pop("RACER_HUGE_PAGES", None)
        else:
            os.environ["RACER_HUGE_PAGES"] = saved
    huge = variants["2MiB"][0].model.__dict__.get("_racer_huge_pages", 0)
    if not huge:
        raise SystemExit("no memory went onto 2 MiB pages here (not Linux, huge pages off, or a kernel "
                         "without MADV_COLLAPSE): nothing to compare")
    med = time_forwards(variants, sizes, args.context, args.repeats)
    print_table(med, "4KiB", ["2MiB"], sizes,
                ab_title(variants["2MiB"][0], args, f"{huge >> 20} MiB of streamed weights on 2 MiB pages; "
                                                    "4KiB / 2MiB > 1: huge pages faster"))


if __name__ == "__main__":
    main()
