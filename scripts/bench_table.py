"""One markdown table from several benchmark runs (e.g. a capacity sweep):

    python scripts/bench_table.py benchmarks/cpu-sweep/cap* benchmarks/cpu-shipped-auto

Prints, per run folder and method: capacity, dtype, MAT, tokens/s, speedup vs ar (same run,
interleaved), mean tree nodes and ms per step, identical outputs.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def rows(folder: Path) -> list[str]:
    s = json.loads((folder / "summary.json").read_text())
    cap, dt = s["settings"]["capacity"], s.get("dtype")
    out = []
    for name, m in s["methods"].items():
        o = m["overall"]
        ident = o.get("identical_to_ar")
        nodes = o.get("tree_nodes")
        ident_s = "–" if ident is None else f"{ident}/{o['turns']}"
        nodes_s = "–" if nodes is None else f"{nodes:.1f}"
        out.append(f"| {folder.name} | {cap} | {dt} | `{name}` | {o['mat']:.2f} | {o['tokens_per_s']:.1f} | "
                   f"{o['speedup_vs_ar']:.2f}× | {nodes_s} | {o.get('ms_per_step') or 0:.1f} | {ident_s} |")
    return out


if __name__ == "__main__":
    print("| run | capacity | dtype | method | MAT | tokens/s | speedup vs ar | tree nodes | ms/step | identical |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for arg in sys.argv[1:]:
        print("\n".join(rows(Path(arg))))
