"""The example traces that ship in assets/traces/: RACER runs of shipped prompts on the default
model, recorded as the app records a race's RACER column (capacity auto, greedy), so the step
inspector, its anatomy and "what if" work without a model (a static Space, or while the model
loads).

    .venv/bin/python scripts/make_traces.py            # rewrites assets/traces/*.json.gz and index.json

Each trace keeps the cost curve of the machine that recorded it, so it replays identically
anywhere; the tokens/s it implies are that machine's.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: (file stem, example title, automaton capacity, max new tokens, what it shows)
TRACES = (
    ("1-rename-in-code", "Rename in code", 10_000, 128,
     "where RACER wins: the answer copies the code it was given, so retrieval and prompt lookup draft long runs"),
    ("2-one-line-joke", "One-line joke", 10_000, 96,
     "where RACER cannot help much: a short new answer, little to copy; most steps commit one token"),
    ("3-small-automaton", "Extract to JSON", 48, 96,
     "an automaton of only 48 nodes, so leaves are evicted at every step (the update stage shows which)"),
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "assets" / "traces"))
    args = ap.parse_args()
    from racer import DecodeConfig, DecodeRun, build_input_ids, load_model, make_drafter
    from racer.costcurve import get_cost_curve
    from racer.replay import Turn
    from racer.sizing import Sizer
    from racer_app.handlers import Studio, load_examples
    from racer_app.models import ModelStore
    from racer_app.settings import racer_options
    from racer_app import tracefile

    lm = load_model("default")
    studio = Studio(ModelStore(lm))
    examples = {e["title"]: e for e in load_examples()}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    index = []
    for stem, title, acap, max_new, why in TRACES:
        ex = examples[title]
        s = studio.defaults
        s.automaton_capacity, s.max_new_tokens, s.capacity_mode = acap, max_new, "auto"
        ids = build_input_ids(lm.tokenizer, ex["prompt"], system=ex.get("system") or None)
        sizer = Sizer(get_cost_curve(lm))
        run = DecodeRun(lm, ids, make_drafter("racer", vocab_size=lm.vocab_size, **racer_options(s)),
                        DecodeConfig(max_new_tokens=max_new, capacity="auto", detail=True), sizer=sizer)
        steps = list(run)
        label = title if acap == 10_000 else f"{title} (an automaton of {acap} nodes)"
        trace = studio.trace_from(lm, steps, ids, "race", label, s, run.result.stop_reason, [Turn(run.start, steps)],
                                  sizer)
        path = tracefile.save(trace, out / f"{stem}.json.gz", lm.tokenizer.all_special_ids)
        index.append({"file": path.name, "title": label, "why": why, "model": lm.name,
                      "tokens": run.result.new_tokens, "forwards": run.result.forwards,
                      "mat": round(run.result.mat, 3)})
        print(f"{path.name}: {run.result.new_tokens} tokens, {len(steps)} steps, MAT {run.result.mat:.2f}, "
              f"{path.stat().st_size / 1024:.0f} KB")
    (out / "index.json").write_text(json.dumps(index, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
