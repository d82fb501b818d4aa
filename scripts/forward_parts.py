"""Where a verify forward's time goes, per tree size: the decoder layers' linear products, the
vocabulary projection, attention, the norms, the rotary embedding, the tree's inputs, and the rest
(Python, residual adds, silu * up, the cache append), each the median of its per-forward ms over
rounds that take every size in turn on one model at one context.

    .venv/bin/python scripts/forward_parts.py                     # this CPU's fast dtype, context 300
    .venv/bin/python scripts/forward_parts.py --dtype float32 --context 1000 --sizes 1,4,8

The parts are timed by wrapping the calls racer's decoder layers make through their plan, so the
model must run racer's fast layers (Llama, Mistral, Qwen2 families on the CPU). Every wrapped call
costs about a microsecond, a few hundred of them a forward: the table shows the plain forward's ms,
timed in the same rounds without the wrappers, beside the instrumented one. What a tree adds over
one token is the column difference; docs/PERFORMANCE.md §1 reads it.
"""
from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from racer.costcurve import random_tree  # noqa: E402
from racer.kvcache import new_cache  # noqa: E402
from racer.models import LoadedModel  # noqa: E402

#: the parts in table order; "rest" is the instrumented forward less all of them.
PARTS = ("linear products", "vocabulary projection", "attention", "norms", "rotary embedding",
         "embedding", "tree inputs", "rest")
_OPS = {"rms_norm": "norms", "rope_rows": "rotary embedding"}


class _TimedOps:
    """A plan's kernel module with the calls it makes per layer timed into `acc`."""

    def __init__(self, ops: Any, acc: dict[str, float]) -> None:
        self._ops, self._acc = ops, acc

    def __getattr__(self, name: str) -> Any:
        f = getattr(self._ops, name)
        part = _OPS.get(name)
        return _timed(f, part, self._acc) if part else f


def _timed(f: Callable[..., Any], part: str, acc: dict[str, float]) -> Callable[..., Any]:
    def g(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return f(*args, **kwargs)
        finally:
            acc[part] += time.perf_counter() - t
    return g


@contextlib.contextmanager
def timed_parts(lm: LoadedModel, acc: dict[str, float]) -> Iterator[None]:
    """Within the block every forward of `lm` adds each part's seconds to `acc`; everything is
    put back on leaving, exceptions included."""
    from racer import verify
    from racer.cpu import attention, layers

    plans = layers.plans(lm.model)
    if not plans:
        raise SystemExit(f"{lm.name} runs no racer decoder layers here: its parts cannot be told apart")
    inner = lm.model.model
    modules = {"vocabulary projection": lm.model.lm_head, "norms": inner.norm,
               "rotary embedding": inner.rotary_emb, "embedding": inner.embed_tokens}
    saved_plans = [(p, p.ops, p.linear) for p in plans]
    saved_attention, saved_inputs = attention.tree_sdpa_forward, verify._inputs
    try:
        for p in plans:
            p.ops = _TimedOps(p.ops, acc)
            p.linear = _timed(p.linear, "linear products", acc)
        attention.tree_sdpa_forward = _timed(saved_attention, "attention", acc)
        verify._inputs = _timed(saved_inputs, "tree inputs", acc)
        for part, m in modules.items():
            m.forward = _timed(m.forward, part, acc)  # an instance attribute shadows the class's
        yield
    finally:
        for p, ops, lin in saved_plans:
            p.ops, p.linear = ops, lin
        attention.tree_sdpa_forward, verify._inputs = saved_attention, saved_inputs
        for m in modules.values():
            m.__dict__.pop("forward", None)


@torch.inference_mode()
def measure(lm: LoadedModel, sizes: list[int], context: int, repeats: int, seed: int = 0
            ) -> dict[int, dict[str, float]]:
    """Per tree size: median ms of each part of an instrumented forward, of the whole instrumented
    forward ("instrumented") and of a plain one timed in the same round ("forward"), after one
    untimed round. Random trees of `racer.costcurve` on a random context of `context` tokens."""
    from racer.verify import forward_tree

    rng = random.Random(seed)
    cache = new_cache(lm.model)
    ids = torch.tensor([[rng.randrange(lm.vocab_size) for _ in range(context)]])
    lm.model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
    acc: dict[str, float] = defaultdict(float)
    samples: dict[int, dict[str, list[float]]] = {T: defaultdict(list) for T in sizes}

    def forward(T: int) -> float:
        tree = random_tree(rng, T, lm.vocab_size)
        t0 = time.perf_counter()
        forward_tree(lm.model, cache, tree, context, lm.device, lm.dtype, lm.layout).argmax(-1).tolist()
        ms = (time.perf_counter() - t0) * 1e3
        cache.crop(-T)
        return ms

    for rep in range(repeats + 1):
        for T in sizes:
            plain = forward(T)
            acc.clear()
            with timed_parts(lm, acc):
                whole = forward(T)
            if rep:
                s = samples[T]
                s["forward"].append(plain)
                s["instrumented"].append(whole)
                for part in PARTS[:-1]:
                    s[part].append(acc[part] * 1e3)
                s["rest"].append(whole - sum(acc[p] for p in PARTS[:-1]) * 1e3)
    return {T: {k: statistics.median(v) for k, v in samples[T].items()} for T in sizes}


def table(med: dict[int, dict[str, float]], sizes: list[int]) -> str:
    """Markdown: one row per part, ms at each size, then what the largest size adds over the first."""
    first, last = sizes[0], sizes[-1]
    lines = ["| part | " + " | ".join(f"T = {T}" for T in sizes) + f" | T = {last} less T = {first} |",
             "|---" * (len(sizes) + 2) + "|"]
    for key in ("forward", "instrumented", *PARTS):
        cells = [f"{med[T][key]:.2f}" for T in sizes]
        name = {"forward": "**plain forward**", "instrumented": "instrumented forward"}.get(key, key)
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {med[last][key] - med[first][key]:+.2f} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--dtype", default=None, help="default: this CPU's fast dtype")
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--sizes", default="1,4,5,6,8")
    args = ap.parse_args()
    from racer import load_model

    lm = load_model(args.model, dtype=args.dtype) if args.dtype else load_model(args.model)
    sizes = [int(s) for s in args.sizes.split(",")]
    med = measure(lm, sizes, args.context, args.repeats)
    print(f"{lm.name} {str(lm.dtype).replace('torch.', '')}, context {args.context}, "
          f"{torch.get_num_threads()} threads, median ms of {args.repeats} rounds:\n")
    print(table(med, sizes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
