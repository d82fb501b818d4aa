"""Where RACER's drafts lose tokens: per verification step of `racer` (capacity auto, greedy), the
draft tokens the sized tree accepted against what other drafts would have accepted at the same
step. Under greedy decoding the continuation is known once the run ends, so a draft's accepted
length is exactly its longest root path that matches the next tokens.

    .venv/bin/python scripts/draft_diagnosis.py                      # Spec-Bench, 2 per category, 256 tokens
    .venv/bin/python scripts/draft_diagnosis.py --per-category 5 --categories rag,translation

Columns (mean accepted draft tokens per step, the root not counted):
  T          nodes the sizer kept;   kept   what that tree accepted;
  pool       the whole candidate pool before sizing (an oracle sizer);
  pool@T     the pool's best T nodes, T as the sizer kept: the root path that matches, cut to T - 1
             draft tokens (an oracle that chooses which nodes, not how many);
  retrieval  the pool's retrieval nodes alone;   chain  the pool's prompt-lookup chain alone;
  hf-pld     transformers' prompt lookup at that step: earliest match of the last 2 (then 1)
             tokens, 10 tokens;   recent-2/10  the same with the most recent match.
Also: the learned acceptance of chain nodes (q, given the parent was accepted) by depth and by
match run, pooled over the runs, how often the chain alone would have accepted more than the sized
tree, how many steps had nothing to draft at all, and the same columns by the model's confidence in
the root (its top-1 probability where the previous forward fixed it) and the previous step's
accepted length: the two step features tree sizing buckets by (racer.sizing).
"""
from __future__ import annotations

import argparse
import collections
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def accepted_length(tokens: list[int], parents: list[int], keep: list[bool], cont: list[int]) -> int:
    """Draft tokens of the tree (its nodes where `keep`) that match `cont` from the root down."""
    kids: dict[int, dict[int, int]] = collections.defaultdict(dict)
    for i in range(1, len(tokens)):
        if keep[i]:
            kids[parents[i]][tokens[i]] = i
    at = n = 0
    for t in cont:
        nxt = kids[at].get(t)
        if nxt is None:
            break
        at, n = nxt, n + 1
    return n


def lookup_chain(seq: list[int], max_ngram: int, length: int, earliest: bool) -> list[int]:
    """Prompt lookup on `seq` (ending with the root): the tokens after a match of its last n tokens."""
    for n in range(min(max_ngram, len(seq) - 1), 0, -1):
        pat = seq[-n:]
        starts = range(0, len(seq) - n) if earliest else range(len(seq) - n - 1, -1, -1)
        for i in starts:
            if seq[i:i + n] == pat and seq[i + n:i + n + length]:
                return seq[i + n:i + n + length]
    return []


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "spec_bench.jsonl"))
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--categories", default=None)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--model", default="default")
    args = ap.parse_args()

    from racer import DecodeConfig, build_input_ids, load_model, make_drafter
    from racer.bench.data import load_rows
    from racer.coldrows import get_cold_rows
    from racer.costcurve import get_cost_curve
    from racer.loop import DecodeRun
    from racer.prompting import common_prefix
    from racer.sizing import Sizer, burst_bucket, conf_bucket

    class PoolSizer(Sizer):
        """Keeps the candidate pool of the step it sizes."""
        pool: Any = None

        def size(self, tree: Any, context_len: int) -> Any:
            self.pool = tree
            return super().size(tree, context_len)

    lm = load_model(args.model)
    get_cold_rows(lm)  # as the benchmark does: racer drafts from them where the root has no row
    curve = get_cost_curve(lm)
    cats = args.categories.split(",") if args.categories else None
    rows, _ = load_rows(args.data, categories=cats, per_category=args.per_category, turns="first")
    cols = ("T", "kept", "pool@T", "pool", "retrieval", "chain", "hf-pld", "recent-2/10")
    by_cat: dict[str, dict[str, list[float]]] = collections.defaultdict(lambda: collections.defaultdict(list))
    q_chain: dict[int, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    q_run: dict[tuple[int, int], list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    by_step: dict[tuple[int, int], dict[str, list[float]]] = collections.defaultdict(lambda: collections.defaultdict(list))
    lost = lost_tokens = 0
    empty = 0             # steps whose pool held the root alone: no source had anything to propose
    tokens = forwards = 0
    cost = cost_ar = 0.0
    for row in rows:
        ids = build_input_ids(lm.tokenizer, row.turns[0])
        sizer = PoolSizer(curve)
        run = DecodeRun(lm, ids, make_drafter("racer", vocab_size=lm.vocab_size),
                        DecodeConfig(max_new_tokens=args.max_new_tokens, capacity="auto"), sizer=sizer)
        steps = []
        before = (-1, -1)   # (burst, confidence) buckets of the step before; -1: the first step
        for rec in run:
            if rec.forwarded:
                p = sizer.pool
                steps.append((rec, list(p.tokens), list(p.parents), list(p.sources),
                              [bool(p.meta[i].get("lookup")) or p.sources[i] == "lookup" for i in range(len(p))],
                              before))
                path = rec.verified_path or rec.accepted
                before = (burst_bucket(len(path) - 1),
                          conf_bucket(float(rec.topk_p[path[-1]][0]) if rec.topk_p is not None else None))
        assert run.result is not None
        full = ids + run.result.token_ids
        tokens += len(run.result.token_ids)
        forwards += run.result.forwards
        for rec, *_ in steps:
            cost += curve.t(len(rec.tree), rec.context_len)
        cost_ar += sum(curve.t(1, len(ids) + k) for k in range(len(run.result.token_ids)))
        for rec, tok, par, src, chain, before in steps:
            empty += len(tok) == 1
            cont, seq = full[rec.context_len + 1:], full[:rec.context_len + 1]
            c = by_cat[row.category]
            kept = len(rec.accepted) - 1
            c["T"].append(len(rec.tree))
            c["kept"].append(kept)
            c["pool"].append(accepted_length(tok, par, [True] * len(tok), cont))
            c["pool@T"].append(min(c["pool"][-1], len(rec.tree) - 1))
            c["retrieval"].append(accepted_length(tok, par, [s in ("retrieval", "both") for s in src], cont))
            c["chain"].append(accepted_length(tok, par, chain, cont))
            c["hf-pld"].append(common_prefix(lookup_chain(seq, 2, 10, True), cont))
            c["recent-2/10"].append(common_prefix(lookup_chain(seq, 2, 10, False), cont))
            if before[0] >= 0:
                for k in ("T", "kept", "pool", "chain"):
                    by_step[before][k].append(c[k][-1])
            if c["chain"][-1] > kept:
                lost += 1
                lost_tokens += c["chain"][-1] - kept
        for key, (a, n) in sizer.model.counts.items():
            if len(key) == 4 and "lookup" in key[0]:       # the coarse (source, depth, rank, run) buckets
                q_chain[key[1]][0] += a
                q_chain[key[1]][1] += n
                q_run[(key[3], min(key[1], 3))][0] += a
                q_run[(key[3], min(key[1], 3))][1] += n
        print(f"{row.category} {row.question_id}: MAT {len(run.result.token_ids) / run.result.forwards:.2f}",
              file=sys.stderr, flush=True)

    print(f"{lm.name}, {lm.device} {str(lm.dtype).replace('torch.', '')}, {len(rows)} turns, "
          f"{args.max_new_tokens} new tokens\n")
    print("| category | steps | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 2) + "|")
    total: dict[str, list[float]] = collections.defaultdict(list)
    for cat, c in by_cat.items():
        print(f"| {cat} | {len(c['kept'])} | " + " | ".join(f"{statistics.mean(c[k]):.2f}" for k in cols) + " |")
        for k in cols:
            total[k] += c[k]
    print(f"| **all** | {len(total['kept'])} | " + " | ".join(f"{statistics.mean(total[k]):.2f}" for k in cols) + " |")
    print(f"\nMAT {tokens / forwards:.3f}; by the cost curve alone (forwards only, no drafting or bookkeeping): "
          f"{cost_ar / cost:.3f}x plain decoding")
    print(f"steps where the chain alone beats the sized tree: {lost} of {len(total['kept'])}, "
          f"{lost_tokens} draft tokens ({lost_tokens / max(1, sum(total['kept'])):.0%} of those accepted)")
    print(f"steps with nothing to draft (a pool of the root alone: no copy-logit or cold row, no match): "
          f"{empty} of {len(total['kept'])}")
    print("\nby the previous step's accepted draft tokens (burst 0: none, 1: one, 2: 2-3, 3: 4+) and the model's "
          "confidence in the root (conf 0: top-1 probability under 0.3, 1: 0.3-0.6, 2: 0.6-0.9, 3: 0.9+):\n")
    print("| burst | conf | steps | T | kept | pool | chain |\n|---|---|---|---|---|---|---|")
    for (b, cf), c in sorted(by_step.items()):
        print(f"| {b} | {cf} | {len(c['kept'])} | " + " | ".join(f"{statistics.mean(c[k]):.2f}"
                                                          for k in ("T", "kept", "pool", "chain")) + " |")
    print()
    print("chain nodes' learned q by depth (6 = 6 and deeper): " +
          ", ".join(f"d{d} {a / n:.2f} ({int(n)})" for d, (a, n) in sorted(q_chain.items()) if n))
    print("chain nodes' learned q by how far the match agrees backwards (run bucket 0: 1-2 tokens, 1: 3, "
          "2: 4-7, 3: 8-15, 4: 16+) and depth (3 = 3 and deeper): " +
          ", ".join(f"r{r}d{d} {a / n:.2f} ({int(n)})" for (r, d), (a, n) in sorted(q_run.items()) if n))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
