"""One markdown table from several benchmark runs (e.g. a capacity sweep):

    python scripts/bench_table.py [--vs hf-pld,hf-pld-stock] benchmarks/cpu-sweep/cap* benchmarks/cpu-shipped-auto

Prints, per run folder and method: capacity, dtype, MAT, tokens/s, speedup vs ar (same run,
interleaved), mean tree nodes and ms per step, identical outputs; with --vs, also each method's
tokens/s over those methods' (same run; "–" where a run lacks one).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def rows(folder: Path, vs: list[str]) -> list[str]:
    s = json.loads((folder / "summary.json").read_text())
    cap, dt = s["settings"]["capacity"], s.get("dtype")
    methods = s["methods"]
    out = []
    for name, m in methods.items():
        o = m["overall"]
        ident = o.get("identical_to_ar")
        nodes = o.get("tree_nodes")
        ident_s = "–" if ident is None else f"{ident}/{o['turns']}"
        nodes_s = "–" if nodes is None else f"{nodes:.1f}"
        ratios = [f"{o['tokens_per_s'] / methods[v]['overall']['tokens_per_s']:.2f}×" if v in methods else "–"
                  for v in vs]
        out.append(f"| {folder.name} | {cap} | {dt} | `{name}` | {o['mat']:.2f} | {o['tokens_per_s']:.1f} | "
                   f"{o['speedup_vs_ar']:.2f}× | " + "".join(r + " | " for r in ratios)
                   + f"{nodes_s} | {o.get('ms_per_step') or 0:.1f} | {ident_s} |")
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vs", default="", help="comma-separated methods to add a speedup column for")
    ap.add_argument("runs", nargs="+")
    a = ap.parse_args()
    vs = [v for v in a.vs.split(",") if v]
    extra = "".join(f" vs {v} |" for v in vs)
    print(f"| run | capacity | dtype | method | MAT | tokens/s | speedup vs ar |{extra} tree nodes | ms/step | identical |")
    print("|---" * (10 + len(vs)) + "|")
    for arg in a.runs:
        print("\n".join(rows(Path(arg), vs)))
