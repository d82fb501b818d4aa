"""Which earlier occurrence a prompt-lookup chain should copy, measured on known answers.

Reads the `ar` answers of a benchmark run (its results.jsonl holds every turn's token ids) and, at
every answer position, asks prompt-lookup chains built by different rules what comes next: the
answer is plain greedy decoding, so a chain's accepted length there is exactly its longest prefix
that matches the answer's next tokens. No model forward is needed (the tokenizer rebuilds the
prompts). Every position counts once, so long copies weigh more here than in decoding, where a
step that accepts 10 tokens skips the 9 positions after it.

    .venv/bin/python scripts/chain_source.py benchmarks/RUN                 # Spec-Bench runs
    .venv/bin/python scripts/chain_source.py benchmarks/RUN --data assets/bench_prompts.jsonl

Rules (racer.drafters.pld.PLDDrafter, periodic as racer's chain): `recent` copies the latest
occurrence of the last 3/2/1 tokens (prompt lookup's rule), `run` the one of the last 3 tokens'
latest occurrences whose text agrees furthest back, `run+long` also runs to 32 tokens behind an
agreement of 16 (racer's default chain).
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RULES = {"recent": {"pick": "recent"}, "run": {"pick": "run"}, "run+long": {"pick": "run", "long_draft": 32}}
WITHIN = (4, 8, 16, 32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", help="a benchmark run folder whose results.jsonl has `ar`")
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "spec_bench.jsonl"),
                    help="the prompts that run used (default: Spec-Bench)")
    ap.add_argument("--model", default="default")
    args = ap.parse_args()

    from racer.bench.data import load_rows
    from racer.drafters.pld import PLDDrafter
    from racer.models import load_model
    from racer.prompting import build_input_ids, common_prefix

    results = [json.loads(line) for line in open(Path(args.run) / "results.jsonl", encoding="utf-8")]
    answers = {(r["question_id"], r["turn"]): r["token_ids"] for r in results if r["method"] == "ar"}
    if not answers:
        raise SystemExit(f"{args.run}: no `ar` turns in results.jsonl")
    tokenizer = load_model(args.model, device="cpu", dtype="float32").tokenizer
    rows, _ = load_rows(args.data)
    total: dict[str, collections.Counter] = {r: collections.Counter() for r in RULES}
    by_cat: dict[str, dict[str, collections.Counter]] = collections.defaultdict(
        lambda: {r: collections.Counter() for r in RULES})
    positions = differ = 0
    better = collections.Counter()      # where one of recent / run holds more of the answer
    either8 = 0                         # the better of the two, within the next 8
    for row in rows:
        answer = answers.get((row.question_id, 1))
        if answer is None:
            continue
        prompt = build_input_ids(tokenizer, row.messages([], row.turns[0]))
        text = prompt + answer
        chains = {r: PLDDrafter(max_draft=16, periodic=True, **kw) for r, kw in RULES.items()}
        for p in range(len(prompt), len(text) - 1):
            context, root, future = text[:p], text[p], text[p + 1:]
            got = {r: d.chain(context, root, 64)[0] for r, d in chains.items()}
            differ += got["recent"] != got["run"]
            positions += 1
            held = {r: common_prefix(chain, future) for r, chain in got.items()}
            if held["run"] != held["recent"]:
                better["run" if held["run"] > held["recent"] else "recent"] += 1
            either8 += min(max(held["run"], held["recent"]), 8)
            for r, n in held.items():
                for w in WITHIN:
                    total[r][w] += min(n, w)
                    by_cat[row.category][r][w] += min(n, w)
                by_cat[row.category][r]["n"] += 1
    print(f"{positions} answer positions of {len(answers)} `ar` turns ({args.run}); the `recent` and `run` "
          f"chains differ at {differ}; `run` holds more of the answer at {better['run']}, `recent` at "
          f"{better['recent']}; the better of the two holds {either8 / positions:.3f} of the next 8\n")
    print("| rule | " + " | ".join(f"next {w}" for w in WITHIN) + " |")
    print("|---|" + "---:|" * len(WITHIN))
    for r in RULES:
        print(f"| {r} | " + " | ".join(f"{total[r][w] / positions:.3f}" for w in WITHIN) + " |")
    print("\nMean tokens accepted within the next 8, per category:\n")
    print("| category | positions | " + " | ".join(RULES) + " |")
    print("|---|---:|" + "---:|" * len(RULES))
    for c, per in by_cat.items():
        n = per["recent"]["n"]
        print(f"| {c} | {n} | " + " | ".join(f"{per[r][8] / n:.3f}" for r in RULES) + " |")


if __name__ == "__main__":
    main()
