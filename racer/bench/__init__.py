"""Spec-Bench-style benchmark: every method against transformers' own decoders, with a report.

    from racer.bench import BenchSettings, load_rows, run_benchmark
    rows, skipped = load_rows("assets/bench_prompts.jsonl", limit=8)
    out = run_benchmark(lm, rows, ["ar", "racer", "hf"], BenchSettings(max_new_tokens=128),
                        out_dir="benchmarks/run1", skipped=skipped)
    out.summary["methods"]["racer"]["overall"]["speedup_vs_ar"]

Command line: `python -m racer.bench --help`. Outputs: results.jsonl (one row per question ×
turn × method), summary.json (what the app's benchmark view reads), report.md (tables; with the
plots a caller passes as `figures`, or `python -m visuals.bench_figures OUT` afterwards).
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, TextIO

from ..models import LoadedModel
from .bandwidth import measure as measure_bandwidth
from .costs import measure_cost_curve
from .data import DEFAULT_DATA, Row, Skipped, load_rows, read_rows, select_rows
from .methods import ALL_METHODS, HF_METHODS, BenchMethod, Conversation, HFMethod, LoopMethod, Outcome, get_method
from .runner import BenchRun, BenchSettings, Encoder, parse_capacity, run_rows
from .summary import build_summary, compare_outputs, context_lengths

DEFAULT_METHODS = ("ar", "pld", "tr", "racer", "racer-nochain", "racer-retrieval", "racer-logits", "racer-half",
                   "racer-hard", "hf", "hf-pld")


@dataclass
class BenchOutput:
    run: BenchRun
    summary: dict[str, Any]
    out_dir: Path | None
    notes: list[str]

    @property
    def results(self) -> list[dict[str, Any]]:
        return self.run.results


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, ensure_ascii=False), encoding="utf-8")
    os.replace(tmp, path)


def run_benchmark(lm: LoadedModel, rows: Sequence[Row], methods: Sequence[str | BenchMethod] = DEFAULT_METHODS,
                  settings: BenchSettings | None = None, *, out_dir: str | Path | None = None,
                  encode: Encoder | None = None, skipped: Sequence[Skipped] | None = None,
                  command: str | None = None, data: dict[str, Any] | None = None, cost_curve: bool = True,
                  figures: Callable[[dict[str, Any]], Mapping[str, Any]] | None = None, images: bool = True,
                  progress: bool = True, log: TextIO | None = None) -> BenchOutput:
    """Run, summarise and (with `out_dir`) write results.jsonl, summary.json and report.md, with
    plots/ when `figures` (summary -> {plot name: figure}, e.g. visuals.bench_figures) is given.

    Ctrl-C during the runs keeps what finished: the summary and report cover it and say
    `interrupted` (the cost curve is then not measured)."""
    log = log or sys.stderr
    st = settings or BenchSettings()
    out = Path(out_dir) if out_dir is not None else None
    fh = None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        fh = open(out / "results.jsonl", "w", encoding="utf-8")
    try:
        run = run_rows(lm, rows, methods, st, encode=encode, skipped=list(skipped or []), results_file=fh,
                       progress=progress, log=log)
    finally:
        if fh is not None:
            fh.close()
    notes: list[str] = []
    curve = None
    if cost_curve and run.results and not run.interrupted:
        try:
            ctxs = context_lengths(run.results)
            log.write(f"measuring the cost curve (verify-forward ms against tree size) at contexts {ctxs}...\n")
            curve = measure_cost_curve(lm, ctxs)
        except KeyboardInterrupt:
            run.interrupted = True
            notes.append("cost curve skipped: interrupted")
        except Exception as e:  # noqa: BLE001 - the benchmark's results matter more than the curve
            notes.append(f"cost curve failed: {e.__class__.__name__}: {e}")
    bandwidth = None
    if run.results and not run.interrupted:
        try:
            bandwidth = measure_bandwidth(lm.model, lm.device)
        except Exception as e:  # noqa: BLE001 - as with the curve, the results matter more
            notes.append(f"bandwidth not measured: {e.__class__.__name__}: {e}")
    info = dict(data or {})
    info.setdefault("questions_run", len({r["question_id"] for r in run.results}))
    info.setdefault("rows_given", len(rows))
    summary = build_summary(lm, run, command=command, data=info, cost_curve=curve)
    summary["bandwidth"] = bandwidth
    if notes:
        summary["notes"] = notes
    if out is not None:
        _write_json(out / "summary.json", summary)
        from .report import write_report
        notes += write_report(out, summary, figures(summary) if figures else None, images=images)["notes"]
    return BenchOutput(run, summary, out, notes)


__all__ = ["run_benchmark", "run_rows", "BenchSettings", "BenchOutput", "BenchRun", "load_rows", "read_rows",
           "select_rows", "Row", "Skipped", "DEFAULT_DATA", "DEFAULT_METHODS", "ALL_METHODS", "HF_METHODS",
           "BenchMethod", "LoopMethod", "HFMethod", "Conversation", "Outcome", "get_method", "build_summary",
           "compare_outputs", "measure_cost_curve", "parse_capacity"]
