"""The benchmark report's figures, drawn from a run's summary (racer.bench.build_summary):

    python -m visuals.bench_figures benchmarks/RUN [--no-images]   # plots/ and report.md with them

Names are racer.bench.report.PLOTS; racer.bench.report.write_report places them in report.md.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from .acceptance_figure import acceptance_histogram
from .benchmark_figure import benchmark_figure
from .cost_figure import cost_figure
from .latency_figure import latency_figure
from .race_figure import race_figure


def bench_figures(summary: dict[str, Any]) -> dict[str, Any]:
    """{plot name: plotly figure} for every plot the summary has data for."""
    figs: dict[str, Any] = {}
    methods = summary["methods"]
    figs["benchmark"] = benchmark_figure(summary)
    hist = {m: [int(k) for k, c in (d.get("accept_hist") or {}).items() for _ in range(c)]
            for m, d in methods.items() if d.get("accept_hist")}
    hist = {m: v for m, v in hist.items() if v and max(v) > 1}   # ar and hf commit one token per step
    if hist:
        figs["acceptance"] = acceptance_histogram(hist)
    figs["latency"] = latency_figure({m: d["latency"] for m, d in methods.items()},
                                     title="Decode latency per generated token (prefill excluded)")
    tvt = (summary.get("tokens_vs_time") or {}).get("methods") or {}
    if tvt:
        figs["tokens_vs_time"] = race_figure(tvt, title="Tokens against each method's own time (whole benchmark)")
    cc = summary.get("cost_curve")
    if cc:
        cap = summary["settings"].get("capacity")
        figs["cost_curve"] = cost_figure({"sizes": cc["sizes"], "ms": cc["ms"],
                                          "chosen_T": cap if isinstance(cap, int) else None},
                                         hardware=f"{summary.get('hardware')}, context {cc['context']} tokens")
    return figs


def main(argv: list[str] | None = None) -> int:
    from racer.bench.report import write_report

    ap = argparse.ArgumentParser(prog="python -m visuals.bench_figures", description=__doc__.splitlines()[0])
    ap.add_argument("run", help="a folder written by python -m racer.bench (holds summary.json)")
    ap.add_argument("--no-images", action="store_true", help="HTML plots only (no PNG rendering)")
    args = ap.parse_args(argv)
    out = Path(args.run)
    try:
        summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        print(f"error: cannot read {out / 'summary.json'}: {e}", file=sys.stderr)
        return 2
    done = write_report(out, summary, bench_figures(summary), images=not args.no_images)
    for n in done["notes"]:
        print(f"note: {n}", file=sys.stderr)
    print(f"wrote {out / 'report.md'} and {len(done['plots'])} plots in {out / 'plots'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
