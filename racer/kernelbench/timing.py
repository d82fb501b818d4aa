"""Interleaved timing of verify forwards for A/B comparisons of one model set-up against another
(dtypes, kernels, caches): every variant runs the same random tree at every size, round after
round, so all see the same machine state."""
from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Callable

import torch

from ..costcurve import random_tree
from ..kvcache import new_cache
from ..models import LoadedModel
from ..verify import forward_tree


def parse_args(doc: str | None, repeats: int, sizes: str, dtype: bool = False,
               context: int = 300) -> tuple[argparse.Namespace, list[int]]:
    """The options every forward-timing script shares; returns the args and the parsed sizes."""
    ap = argparse.ArgumentParser(description=doc)
    ap.add_argument("--model", default="default")
    if dtype:
        ap.add_argument("--dtype", default="float32")
    ap.add_argument("--context", type=int, default=context)
    ap.add_argument("--repeats", type=int, default=repeats)
    ap.add_argument("--sizes", default=sizes)
    args = ap.parse_args()
    return args, [int(x) for x in args.sizes.split(",")]


#: name -> (model, a switch run before each of its forwards, e.g. to select a kernel)
Variants = dict[str, tuple[LoadedModel, Callable[[], object]]]


@torch.inference_mode()
def time_forwards(variants: Variants, sizes: list[int], context: int, repeats: int,
                  seed: int = 0, cache_for: dict[str, Callable[[object], object]] | None = None,
                  read: Callable[[torch.Tensor], object] = lambda logits: logits.argmax(-1).tolist()
                  ) -> dict[tuple[str, int], float]:
    """Median ms of one verify forward per (variant, T), after one untimed round, including
    `read` of its logits (default: the argmax, read back as the loop does).
    `cache_for` may give a variant its own KV cache factory (default: racer's)."""
    rng = random.Random(seed)
    caches = {}
    for name, (lm, switch) in variants.items():
        switch()
        caches[name] = (cache_for or {}).get(name, new_cache)(lm.model)
        ids = torch.tensor([[rng.randrange(lm.vocab_size) for _ in range(context)]])
        lm.model(input_ids=ids, cache=caches[name], use_cache=True, logits_to_keep=1)
    vocab = min(lm.vocab_size for lm, _ in variants.values())
    times: dict[tuple[str, int], list[float]] = {(n, T): [] for n in variants for T in sizes}
    for rep in range(repeats + 1):
        for T in sizes:
            tree = random_tree(rng, T, vocab)
            for name, (lm, switch) in variants.items():
                switch()
                t0 = time.perf_counter()
                read(forward_tree(lm.model, caches[name], tree, context, lm.device, lm.dtype, lm.layout))
                if rep:
                    times[(name, T)].append((time.perf_counter() - t0) * 1e3)
                caches[name].crop(-T)
    return {k: statistics.median(v) for k, v in times.items()}


def ab_title(lm: LoadedModel, args: argparse.Namespace, legend: str) -> str:
    """The heading of an A/B table on one model: model, dtype, kernel, context, threads, repeats."""
    dt = str(lm.dtype).replace("torch.", "")
    return (f"verify forward, {lm.name} {dt} ({lm.notes[0] if lm.notes else 'stock kernel'}), context "
            f"{args.context}, {torch.get_num_threads()} threads, median of {args.repeats} (ms); {legend}")


def print_table(med: dict[tuple[str, int], float], base: str, others: list[str], sizes: list[int],
                title: str) -> None:
    """Markdown: T, ms per variant, base/other for each other (>1: other faster), and
    t(T)/t(first size) for each other."""
    print(title + "\n")
    names = [base, *others]
    head = names + [f"{base} / {o}" for o in others] + [f"t(T)/t({sizes[0]}) {o}" for o in others]
    print("| T | " + " | ".join(head) + " |")
    print("|---" * (len(head) + 1) + "|")
    for T in sizes:
        cells = [f"{med[(n, T)]:.1f}" for n in names]
        cells += [f"{med[(base, T)] / med[(o, T)]:.2f}" for o in others]
        cells += [f"{med[(o, T)] / med[(o, sizes[0])]:.2f}" for o in others]
        print(f"| {T} | " + " | ".join(cells) + " |")
