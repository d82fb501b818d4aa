"""python -m racer.bench --methods ar,racer,hf --max-new-tokens 256 --out benchmarks/RUN

Writes results.jsonl, summary.json and report.md (tables) into --out; the plots come from the
figure layer: `python -m visuals.bench_figures benchmarks/RUN` (`make bench` runs both).
`--export spec-bench DIR` also writes Spec-Bench answer files (racer.bench.specbench).

Exit status: 0 done, 1 done but a greedy method's output differed from ar's beyond a
floating-point tie (a bug), 2 bad arguments or model, 130 interrupted (what finished is kept).
"""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from .data import DEFAULT_DATA
    from .methods import ALL_METHODS
    from . import DEFAULT_METHODS
    from ..cpu.linear import KERNELS
    p = argparse.ArgumentParser(prog="python -m racer.bench",
                                description="Benchmark every decoding method (and transformers' generate) on a JSONL "
                                            "of {question_id, category, turns[, system]}; writes results.jsonl, summary.json "
                                            "and report.md into --out (plots: python -m visuals.bench_figures OUT).")
    p.add_argument("--data", default=str(DEFAULT_DATA), help="JSONL rows (default: the shipped assets/bench_prompts.jsonl)")
    p.add_argument("--limit", type=int, default=None, help="run only the first N rows (after --categories)")
    p.add_argument("--per-category", type=int, default=None, help="run only the first N rows of each category")
    p.add_argument("--categories", default=None, help="comma-separated categories to keep")
    p.add_argument("--round-robin", action="store_true",
                   help="run the rows category by category in turn, so a run stopped early (Ctrl-C keeps what "
                        "finished) still covers every category alike")
    p.add_argument("--turns", choices=("all", "first"), default="all", help="all turns of each row, or the first only")
    p.add_argument("--methods", default=",".join(DEFAULT_METHODS),
                   help=f"comma-separated, run interleaved in this order; known: {','.join(ALL_METHODS)}; a decode-loop method may fix its own capacity, e.g. racer@8,racer@auto (a capacity sweep in one run), or its sizer's settings, racer@auto-cal,racer@auto-nocal,racer@auto-norun,racer@auto-noconf,racer@auto-cap64,racer@auto-measured")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--capacity", default=None, help="draft tree size incl. the root, or 'auto' (default: the library's)")
    p.add_argument("--model", default="default",
                   help="'default' (SmolLM2-135M-Instruct), 'gemma3-270m', a hub id, a local folder or a .gguf file")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (the identity check runs only then)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0, help="0 = off (passed to generate() explicitly too)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=1, help="time every turn R times (interleaved); report the median")
    p.add_argument("--warmup", type=int, default=1, help="untimed warm-up passes over every method")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--kernel", choices=["auto", *KERNELS], default="auto",
                   help="linear kernel, for every method alike (auto: RACER_LINEAR, by default the one "
                        "measured fastest on this device and dtype)")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--no-cost-curve", action="store_true", help="skip measuring the cost curve")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--report-only", action="store_true",
                   help="run nothing: re-render report.md's tables from --out's summary.json")
    p.add_argument("--add-bandwidth", action="store_true",
                   help="with --report-only: measure this machine's streaming bandwidth and the model's weight bytes "
                        "now (for a run made without them; run it on the machine that ran the benchmark, idle)")
    p.add_argument("--export", nargs=2, action="append", metavar=("FORMAT", "DIR"), default=[],
                   help="also write the answers in another benchmark's format into DIR; FORMAT 'spec-bench': one "
                        "answer file per method, as Spec-Bench's evaluation/speed.py and equal.py read them "
                        "(with --report-only: from --out's results.jsonl)")
    return p.parse_args(argv)


EXPORT_FORMATS = ("spec-bench",)


def check_exports(exports: list[list[str]]) -> None:
    for fmt, _ in exports:
        if fmt not in EXPORT_FORMATS:
            raise ValueError(f"--export: unknown format {fmt!r}; known: {', '.join(EXPORT_FORMATS)}")


def write_exports(exports: list[list[str]], results: list[dict], summary: dict) -> None:
    from .specbench import export
    for _, folder in exports:
        done = export(results, folder, model=summary.get("model") or "model", dtype=summary.get("dtype") or "?",
                      temperature=summary["settings"]["temperature"], methods=list(summary["methods"]))
        print(f"wrote {len(done['files'])} Spec-Bench answer files ({done['questions']} questions) to {folder}" +
              (f"; left out (not finished by every method): {done['left_out']}" if done["left_out"] else ""),
              file=sys.stderr)


def print_table(summary: dict, out=sys.stdout) -> None:
    rows = [("method", "turns", "MAT", "tok/s", "vs ar", "Spec-Bench vs ar", "vs hf", "identical")]
    for m, d in summary["methods"].items():
        o = d["overall"]
        f = lambda x, nd=2, s="": "-" if x is None else f"{x:.{nd}f}{s}"  # noqa: E731
        ident = o.get("identical_to_ar")
        rows.append((m, str(o["turns"]), f(o.get("mat")), f(o.get("tokens_per_s"), 1), f(o.get("speedup_vs_ar"), 2, "x"),
                     f(o.get("specbench_speedup_vs_ar"), 2, "x"), f(o.get("speedup_vs_hf"), 2, "x"),
                     "-" if ident is None else f"{ident}/{o['turns']}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        out.write("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) + "\n")


def add_bandwidth(out: Path, summary: dict) -> None:
    """Measure the bandwidth figures of a run made without them and write them into its summary.json."""
    from ..models import load_model
    from . import _write_json
    from .bandwidth import measure
    lm = load_model(summary.get("model_spec") or "default", device=summary.get("device") or "auto",
                    dtype=summary.get("dtype") or "auto")
    summary["bandwidth"] = measure(lm.model, lm.device)
    _write_json(out / "summary.json", summary)


def report_only(out: Path, exports: list[list[str]] | None = None, bandwidth: bool = False) -> int:
    import json
    from .report import write_report
    try:
        summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
        results = [json.loads(line) for line in (out / "results.jsonl").read_text(encoding="utf-8").splitlines()
                   if line.strip()] if exports else []
    except (OSError, ValueError) as e:
        print(f"error: cannot read the run in {out}: {e}", file=sys.stderr)
        return 2
    if bandwidth:
        add_bandwidth(out, summary)
    for n in write_report(out, summary)["notes"]:
        print(f"note: {n}", file=sys.stderr)
    print(f"wrote {out / 'report.md'}", file=sys.stderr)
    if exports:
        try:
            write_exports(exports, results, summary)
        except OSError as e:
            print(f"error: --export: {e}", file=sys.stderr)
            return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    try:
        check_exports(args.export)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.report_only:
        return report_only(Path(args.out), args.export, args.add_bandwidth)
    from ..models import ModelLoadError, load_model
    from . import BenchSettings, get_method, load_rows, parse_capacity, run_benchmark

    try:
        capacity = parse_capacity(args.capacity)
        methods = [m.strip() for m in args.methods.split(",") if m.strip()]
        for m in methods:
            get_method(m)
        if len(set(methods)) != len(methods):
            raise ValueError("a method is listed twice in --methods")
        cats = [c for c in args.categories.split(",")] if args.categories else None
        rows, skipped = load_rows(args.data, categories=cats, limit=args.limit, per_category=args.per_category,
                                  turns=args.turns, round_robin=args.round_robin)
        if args.repeats < 1 or args.max_new_tokens < 1:
            raise ValueError("--repeats and --max-new-tokens must be at least 1")
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not rows:
        print(f"error: no rows to run from {args.data}" + (f" ({len(skipped)} skipped)" if skipped else ""),
              file=sys.stderr)
        for s in skipped:
            print(f"  skipped line {s.line}: {s.reason}", file=sys.stderr)
        return 2
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    try:
        lm = load_model(args.model, device=args.device, dtype=args.dtype,
                        linear_kernel=args.kernel)
    except ModelLoadError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    settings = BenchSettings(max_new_tokens=args.max_new_tokens, capacity=capacity, temperature=args.temperature,
                             top_p=args.top_p, top_k=args.top_k, seed=args.seed, repeats=args.repeats,
                             warmup=args.warmup)
    n_turns = sum(len(r.turns) for r in rows)
    print(f"{lm.name} on {lm.device} {str(lm.dtype).replace('torch.', '')}: {len(rows)} rows, {n_turns} turns, "
          f"methods {','.join(methods)}, {args.repeats} repeat(s) -> {args.out}", file=sys.stderr)
    command = "python -m racer.bench " + shlex.join(argv)
    try:
        out = run_benchmark(lm, rows, methods, settings, out_dir=args.out, skipped=skipped, command=command,
                            data={"path": args.data, "rows_in_file_selected": len(rows), "turns": args.turns,
                                  "limit": args.limit, "per_category": args.per_category, "categories": cats},
                            cost_curve=not args.no_cost_curve, progress=not args.no_progress)
    except (ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    s = out.summary
    print_table(s)
    if args.export:
        try:
            write_exports(args.export, out.results, s)
        except OSError as e:
            print(f"error: --export: {e} (the run itself is in {args.out})", file=sys.stderr)
            return 2
    for n in out.notes:
        print(f"note: {n}", file=sys.stderr)
    outdir = Path(args.out)
    print(f"wrote {outdir / 'results.jsonl'}, {outdir / 'summary.json'}, {outdir / 'report.md'}; plots: "
          f"python -m visuals.bench_figures {shlex.quote(str(outdir))}", file=sys.stderr)
    if s.get("interrupted"):
        return 130
    chk = s.get("identical_check")
    if chk is not None and not chk["ok"]:
        print("ERROR: a greedy method's output differs from ar's beyond a floating-point tie; see report.md",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
