"""How well tree sizing's P(node accepted) matches what happens: for every node of every candidate
pool `racer` (capacity auto, greedy) drafts, the probability the sizer gave it against whether the
answer continued through it. Under greedy decoding the continuation is known once the run ends,
so a pool node "would be accepted" exactly when its root path matches the next tokens, kept or not.

    .venv/bin/python scripts/sizing_calibration.py                     # Spec-Bench, 2 per category, 256 tokens
    .venv/bin/python scripts/sizing_calibration.py --data assets/bench_prompts.jsonl --per-category 5

Tables (markdown): the kept nodes and the nodes sizing left out, by bins of predicted P (mean
predicted against the share that the answer continued through); the kept nodes by source (a
retrieval or copy-logit node that is also on the prompt-lookup chain counts as `+chain`; `cold`: a
cold row's entry) and, for the kept nodes whose parent the answer continued through, the predicted
q = P(node) / P(parent) against the realised one, by source and depth. A well-calibrated sizer
reads the same in both columns; docs/PERFORMANCE.md §4.1 has what a run of it showed.
"""
from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BINS = (0.0, 0.01, 0.03, 0.06, 0.1, 0.2, 0.3, 0.45, 0.6, 0.75, 0.9, 1.01)


def p_bin(p: float) -> int:
    for i in range(len(BINS) - 1):
        if p < BINS[i + 1]:
            return i
    return len(BINS) - 2


def add(acc: dict[Any, list[float]], key: Any, predicted: float, hit: float) -> None:
    """One node into `acc[key]`: [sum of predictions, nodes, continued through]."""
    e = acc[key]
    e[0] += predicted
    e[1] += 1
    e[2] += hit


def table(title: str, rows: dict[Any, list[float]], label: Any) -> None:
    print(f"\n{title}\n\n| {label} | nodes | mean predicted | continued through |\n|---|---|---|---|")
    for key in sorted(rows):
        pred, n, hit = rows[key]
        print(f"| {key} | {int(n)} | {pred / n:.3f} | {hit / n:.3f} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "spec_bench.jsonl"))
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--model", default="default")
    args = ap.parse_args()

    from racer import DecodeConfig, build_input_ids, load_model, make_drafter
    from racer.bench.data import load_rows
    from racer.coldrows import get_cold_rows
    from racer.costcurve import get_cost_curve
    from racer.loop import DecodeRun
    from racer.sizing import Sizer

    class PlanSizer(Sizer):
        """Keeps the pool and the plan of the step it sizes."""
        last: Any = None

        def plan(self, tree: Any, context_len: int) -> Any:
            p = super().plan(tree, context_len)
            self.last = (tree, p)
            return p

    lm = load_model(args.model)
    get_cold_rows(lm)  # as the benchmark does
    curve = get_cost_curve(lm)
    rows, _ = load_rows(args.data, per_category=args.per_category, turns="first")
    new = lambda: [0.0, 0.0, 0.0]  # noqa: E731 - sum of predictions, nodes, continued through
    kept: dict[Any, list[float]] = collections.defaultdict(new)
    left: dict[Any, list[float]] = collections.defaultdict(new)
    by_source: dict[Any, list[float]] = collections.defaultdict(new)
    cond: dict[Any, list[float]] = collections.defaultdict(new)
    tokens = forwards = 0
    for row in rows:
        ids = build_input_ids(lm.tokenizer, row.turns[0])
        sizer = PlanSizer(curve)
        run = DecodeRun(lm, ids, make_drafter("racer", vocab_size=lm.vocab_size),
                        DecodeConfig(max_new_tokens=args.max_new_tokens, capacity="auto"), sizer=sizer)
        pools = []
        for rec in run:
            if rec.forwarded:
                pool, plan = sizer.last
                pools.append((rec.context_len, pool, list(plan.probs), set(plan.keep)))
        assert run.result is not None
        tokens += len(run.result.token_ids)
        forwards += run.result.forwards
        full = ids + run.result.token_ids
        for context_len, pool, probs, keep in pools:
            cont = full[context_len + 1:]
            through = [True] * len(pool)
            for i in range(1, len(pool)):
                d = pool.depths[i]
                through[i] = through[pool.parents[i]] and d <= len(cont) and cont[d - 1] == pool.tokens[i]
            for i in range(1, len(pool)):
                p, hit = probs[i], float(through[i])
                add(kept if i in keep else left, BINS[p_bin(p)], p, hit)
                if i not in keep:
                    continue
                meta = pool.meta[i]
                src = "cold" if meta.get("cold") else pool.sources[i]
                if meta.get("lookup") and src not in ("lookup", "cold"):
                    src += "+chain"
                add(by_source, src, p, hit)
                parent = pool.parents[i]
                if through[parent]:
                    add(cond, (src, min(pool.depths[i], 4)), p / max(probs[parent], 1e-12), hit)
        print(f"{row.category} {row.question_id}: MAT {len(run.result.token_ids) / run.result.forwards:.2f}",
              file=sys.stderr, flush=True)

    print(f"{lm.name}, {lm.device} {str(lm.dtype).replace('torch.', '')}, {len(rows)} turns, "
          f"{args.max_new_tokens} new tokens, MAT {tokens / forwards:.3f}")
    table("Kept nodes, by predicted P (bins by lower edge)", kept, "P from")
    table("Nodes sizing left out, by predicted P", left, "P from")
    table("Kept nodes, by source", by_source, "source")
    table("Kept nodes whose parent the answer continued through: predicted q = P(node) / P(parent), "
          "by (source, depth; 4 = 4 and deeper)", cond, "source, depth")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
