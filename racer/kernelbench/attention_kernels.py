"""Verify-forward time against tree size with transformers' sdpa attention, with
racer.cpu.attention's GQA-packing variant of it and with racer's step-attention kernel for the
dtype (bfloat16 on a CPU with AVX512-BF16, float32 on AVX2), interleaved in one run on one model:

    python -m racer.kernelbench.attention_kernels [--context 1500] [--repeats 9] [--sizes 1,2,4,8,16,32] [--dtype float32]

Prints a markdown table of median ms, sdpa / each variant (>1: the variant faster) and t(T)/t(1).
The gap grows with the context: what racer_sdpa saves is a copy of the KV cache per layer.
"""
from __future__ import annotations

from typing import Callable

from ..cpu import ON, attention
from ..models import LoadedModel, load_model
from .timing import ab_title, parse_args, print_table, time_forwards


STEP = "step kernel"


def _use(lm: LoadedModel, name: str, step_kernel: bool = False) -> Callable[[], None]:
    def switch() -> None:
        lm.model.config._attn_implementation = name
        ON.step_attention = step_kernel
    return switch


def main() -> None:
    args, sizes = parse_args(__doc__, repeats=9, sizes="1,2,4,8,16,32", context=1500, dtype=True)
    lm = load_model(args.model, device="cpu", dtype=args.dtype)
    variants = {"sdpa": (lm, _use(lm, "sdpa")), attention.NAME: (lm, _use(lm, attention.NAME))}
    if attention.step_kernel_available(lm.dtype):
        variants[STEP] = (lm, _use(lm, attention.NAME, step_kernel=True))
    was = ON.step_attention
    try:
        med = time_forwards(variants, sizes, args.context, args.repeats)
    finally:
        lm.model.config._attn_implementation = attention.NAME
        ON.step_attention = was
    others = [n for n in variants if n != "sdpa"]
    print_table(med, "sdpa", others, sizes,
                ab_title(lm, args, f"sdpa / variant > 1: the variant faster; {attention.NAME} packs query heads "
                                   f"around PyTorch's kernel, '{STEP}' is racer's own"))


if __name__ == "__main__":
    main()
