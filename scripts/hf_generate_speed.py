"""transformers' own generate() against generate(custom_generate=racer.generate), interleaved.

    .venv/bin/python scripts/hf_generate_speed.py                      # default model, float32, 128 tokens
    .venv/bin/python scripts/hf_generate_speed.py --repeats 5 --json out.json

On the shipped prompts (assets/bench_prompts.jsonl, the first turn of the first row of each
category), per prompt and repeat: `model.generate(ids, max_new_tokens=N, do_sample=False)` and
`model.generate(ids, custom_generate=racer.generate, max_new_tokens=N)` back to back, the order
alternating, so a shared machine's load hits both alike. Prints tokens/s of both, the ratio of
each adjacent pair and their median, and whether the outputs are identical token for token.
Exits 1 if any output differs. Both calls run on the same model object (racer's CPU kernels
installed by load_model, as every method of the benchmark runs).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--data", default=None, help="JSONL rows (default: the shipped prompts)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None, help="also write every timing here")
    args = ap.parse_args()

    import torch

    import racer
    from racer import build_input_ids, load_model
    from racer.bench.data import load_rows

    if args.threads:
        torch.set_num_threads(args.threads)
    lm = load_model(args.model, device="cpu", dtype=args.dtype)
    model, tok = lm.model, lm.tokenizer
    rows, _ = load_rows(args.data, per_category=1, turns="first")
    prompts = [(r.question_id, torch.tensor([build_input_ids(tok, r.turns[0])])) for r in rows]
    n = args.max_new_tokens

    def stock(ids):
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False)

    def with_racer(ids):
        return model.generate(ids, attention_mask=torch.ones_like(ids), custom_generate=racer.generate,
                              max_new_tokens=n)

    # Untimed: kernels, allocator, and racer's cost curve (measured on the first call on a machine).
    warm = prompts[0][1]
    for fn in (stock, with_racer):
        fn(warm)

    runs: list[dict] = []
    for r in range(args.repeats):
        for i, (qid, ids) in enumerate(prompts):
            order = [("stock", stock), ("racer", with_racer)]
            if (r + i) % 2:
                order.reverse()
            got = {}
            for name, fn in order:
                t0 = time.perf_counter()
                out = fn(ids)
                wall = time.perf_counter() - t0
                got[name] = (out[0, ids.shape[1]:].tolist(), wall)
            (s_ids, s_wall), (r_ids, r_wall) = got["stock"], got["racer"]
            runs.append({"question_id": qid, "repeat": r, "first": order[0][0], "new_tokens": len(s_ids),
                         "racer_new_tokens": len(r_ids),
                         "stock_s": s_wall, "racer_s": r_wall, "stock_tps": len(s_ids) / s_wall,
                         "racer_tps": len(r_ids) / r_wall, "identical": s_ids == r_ids})
            x = runs[-1]
            print(f"{qid:18s} r{r}  stock {x['stock_tps']:6.1f} tok/s  racer {x['racer_tps']:6.1f} tok/s  "
                  f"ratio {x['racer_tps'] / x['stock_tps']:.2f}  {'identical' if x['identical'] else 'DIFFERENT'}",
                  flush=True)

    ratios = [x["racer_tps"] / x["stock_tps"] for x in runs]
    per_prompt = {qid: statistics.median(x["racer_tps"] / x["stock_tps"] for x in runs if x["question_id"] == qid)
                  for qid, _ in prompts}
    summary = {
        "model": lm.name, "dtype": str(lm.dtype).replace("torch.", ""), "threads": torch.get_num_threads(),
        "max_new_tokens": n, "prompts": len(prompts), "repeats": args.repeats,
        "stock_tokens_per_s": sum(x["new_tokens"] for x in runs) / sum(x["stock_s"] for x in runs),
        "racer_tokens_per_s": sum(x["racer_new_tokens"] for x in runs) / sum(x["racer_s"] for x in runs),
        "median_pair_ratio": statistics.median(ratios), "median_ratio_per_prompt": per_prompt,
        "identical": f"{sum(x['identical'] for x in runs)}/{len(runs)}",
    }
    print(json.dumps(summary, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "runs": runs}, indent=1))
    return 0 if all(x["identical"] for x in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
