"""report.md from a benchmark summary, with the plots a caller hands in.

The tables come from the summary alone. Plots are figures drawn by the layer above
(`python -m visuals.bench_figures DIR` draws them for a run folder, the app's benchmark view
passes them in); they are written as interactive HTML (plotly; one local plotly.min.js beside
them, so they work offline) and as PNG where kaleido can render offline (it drives Chromium).
If rendering fails the report says so and links the HTML.
"""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Mapping, Sequence

from .bandwidth import drawn
from .costs import interpolate

PLOTS = ("benchmark", "acceptance", "latency", "tokens_vs_time", "cost_curve")


def _f(x: Any, nd: int = 2, suffix: str = "") -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.{nd}f}{suffix}"
    return f"{x}{suffix}"


# -- plots -----------------------------------------------------------------------------------
# The figures themselves come from the caller (visuals.bench_figures draws them from the summary;
# the library does not draw): `figures` maps a name of PLOTS to a plotly figure.

def write_images(figs: dict[str, Any], paths: dict[str, Path], timeout_s: float = 240.0) -> str | None:
    """Render PNGs with kaleido (one Chromium for all); returns an error note or None."""
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            import plotly.io as pio
            names = list(figs)
            fs = [figs[n] for n in names]
            # kaleido ignores the layout's size unless given explicitly.
            pio.write_images(fs, [str(paths[n]) for n in names], format="png", scale=1,
                             width=[f.layout.width or 900 for f in fs], height=[f.layout.height or 500 for f in fs])
        except Exception as e:  # noqa: BLE001
            box["error"] = f"{e.__class__.__name__}: {str(e).splitlines()[0] if str(e) else ''}"

    th = threading.Thread(target=work, daemon=True)
    th.start()
    th.join(timeout_s)
    if th.is_alive():
        return f"image rendering did not finish in {timeout_s:.0f} s"
    if "error" in box:
        return box["error"]
    missing = [n for n in figs if not paths[n].is_file()]
    return f"no image for {', '.join(missing)}" if missing else None


# -- markdown --------------------------------------------------------------------------------

def _table(header: Sequence[str], rows: Sequence[Sequence[str]], align: str | None = None) -> str:
    align = align or ("l" + "r" * (len(header) - 1))
    sep = ["---:" if a == "r" else ":---" for a in align]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(sep) + " |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _speed(x: Any) -> str:
    return "–" if x is None else f"{x:.2f}×"


def overall_table(summary: dict[str, Any]) -> str:
    rows = []
    for m, d in summary["methods"].items():
        o = d["overall"]
        ident = o.get("identical_to_ar")
        rows.append([f"`{m}`", str(o["turns"]), str(o["new_tokens"]), _f(o.get("mat")), _f(o.get("tokens_per_s"), 1),
                     _speed(o.get("speedup_vs_ar")), _speed(o.get("decode_speedup_vs_ar")),
                     _speed(o.get("specbench_speedup_vs_ar")),
                     _speed(o.get("speedup_vs_hf")), _speed(o.get("specbench_speedup_vs_hf")),
                     "–" if ident is None else f"{ident}/{o['turns']}",
                     _f(o.get("ms_per_step")), _f(o.get("draft_ms")), _f(o.get("forward_ms")),
                     _f(o.get("update_ms")), _f(o.get("tree_nodes"), 1)])
    return _table(["method", "turns", "tokens", "MAT", "tokens/s", "speedup vs ar", "without prefill",
                   "Spec-Bench speedup vs ar",
                   "speedup vs hf", "Spec-Bench speedup vs hf", "identical to ar", "ms/step", "draft ms", "forward ms", "update ms", "tree nodes"], rows)


def bandwidth_section(summary: dict[str, Any]) -> str:
    bw = summary["bandwidth"]
    rows = []
    for m, d in summary["methods"].items():
        o = d["overall"]
        r = drawn(bw, o.get("ms_per_step"))
        if r is None:
            continue
        rows.append([f"`{m}`", _f(r["forwards_per_s"], 1), _f(o.get("mat")), _f(r["weight_gbs"], 1),
                     "–" if r["of_stream"] is None else f"{100 * r['of_stream']:.0f} %"])
    low = f"; the slowest buffer read {bw['stream_min_gbs']:.1f}" if bw.get("stream_min_gbs") else ""
    text = (f"A forward streams the model's weights, {bw['weight_bytes'] / 1e6:.0f} MB in "
            f"{summary.get('dtype')}; this machine streams {bw['stream_gbs']:.1f} GB/s ({bw['stream_how']}{low}). "
            "forwards/s = 1000 / ms per step; weight GB/s = weight bytes x forwards/s (the KV cache a forward "
            "also reads is left out). Near 100 % a method can only gain by accepting more tokens per forward.")
    return text + "\n\n" + _table(["method", "forwards/s", "MAT", "weight GB/s", "of streaming bandwidth"], rows)


def category_table(summary: dict[str, Any], key: str = "speedup_vs_ar") -> str:
    methods = list(summary["methods"])
    cats = list(summary.get("categories") or [])
    rows = []
    for c in cats + ["overall"]:
        cells = [f"**{c}**" if c == "overall" else c]
        for m in methods:
            d = summary["methods"][m]
            s = d["overall"] if c == "overall" else d["categories"].get(c)
            if not s:
                cells.append("–")
                continue
            cells.append(f"{_f(s.get('mat'))} / {_speed(s.get(key))}")
        rows.append(cells)
    return _table(["category"] + [f"`{m}`" for m in methods], rows)


def identical_section(summary: dict[str, Any], max_rows: int = 25) -> str:
    chk = summary.get("identical_check")
    if chk is None:
        if not summary["settings"]["greedy"]:
            return "Sampling run: outputs are exact samples, not comparable token for token; no identity check.\n"
        return "No `ar` run, so no identity check.\n"
    lines = [f"Greedy decoding must reproduce `ar` token for token. For each difference: the first differing "
             f"position and ar's top-2 logit margin there (ar's own logits, as it decoded: the prompt's prefill, "
             f"then one token per forward); a gap between ar's token and the method's within "
             f"{chk['tie_tolerance']} (this dtype's rounding) is a floating-point tie, anything else a bug. "
             f"*inherited* = an earlier turn already differed, so the conversation is not the same.", ""]
    rows = []
    for m, d in summary["methods"].items():
        i = d.get("identical")
        if not i:
            continue
        rows.append([f"`{m}`", str(i["compared"]), str(i["identical"]), str(i["ties"]), str(i["inherited"]),
                     str(i["mismatches"] + i["length"])])
    if rows:
        lines.append(_table(["method", "compared", "identical", "ties", "inherited", "mismatches (bugs)"], rows))
    diffs = [(m, x) for m, d in summary["methods"].items() for x in (d.get("identical") or {}).get("differences", [])]
    if diffs:
        lines += ["", _table(["method", "question", "turn", "position", "ar token", "method token", "top-2 margin",
                              "gap", "rank", "verdict"],
                             [[f"`{m}`", str(x["question_id"]), str(x["turn"]), str(x["position"]), str(x["ar_token"]),
                               str(x["method_token"]), _f(x.get("margin_top2"), 4), _f(x.get("gap"), 4),
                               _f(x.get("method_token_rank")),
                               f"**{x['verdict']}**" if x["verdict"] in ("mismatch", "length") else x["verdict"]]
                              for m, x in diffs[:max_rows]])]
        if len(diffs) > max_rows:
            lines.append(f"\n… and {len(diffs) - max_rows} more in summary.json.")
    verdict = "**all outputs identical or floating-point ties**" if chk["ok"] else \
        "**MISMATCHES FOUND: a method changed the output; this is a bug**"
    lines += ["", verdict]
    return "\n".join(lines) + "\n"


def cost_section(summary: dict[str, Any]) -> str:
    cc = summary.get("cost_curve")
    if not cc:
        return "Not measured.\n"
    head = ["context \\ T"] + [str(s) for s in cc["sizes"]]
    rows = [[str(c)] + [f"{v:.1f}" for v in row] for c, row in zip(cc["contexts"], cc["grid"])]
    out = [f"Median ms of one verify forward with a T-node tree (random bushy trees, {cc['repeats']} repeats, "
           f"after the timed runs; {cc['measured_by']}):", "", _table(head, rows), ""]
    sizes, ms = cc["sizes"], cc["ms"]
    if 1 in sizes:
        t1 = ms[sizes.index(1)]
        lines = []
        for m, d in summary["methods"].items():
            o = d["overall"]
            if o.get("tree_nodes") and o.get("mat") and o["tree_nodes"] > 1:
                tT = interpolate(sizes, ms, o["tree_nodes"])
                ceil = o["mat"] * t1 / tT
                lines.append(f"- `{m}`: MAT {o['mat']:.2f} with {o['tree_nodes']:.1f}-node trees on average: "
                             f"speedup ceiling MAT·t(1)/t(T) = {ceil:.2f}× (measured vs ar: {_speed(o.get('speedup_vs_ar'))})")
        if lines:
            out += [f"At context {cc['context']}, t(1) = {t1:.1f} ms. The forward-pass bound on speedup, "
                    f"ignoring drafting and bookkeeping:", ""] + lines
    return "\n".join(out) + "\n"


def render_markdown(summary: dict[str, Any], plots: dict[str, dict[str, str | None]], notes: Sequence[str]) -> str:
    st = summary["settings"]
    data = summary.get("data") or {}
    m = summary.get("machine") or {}
    ver = m.get("versions") or {}
    mode = "greedy" if st["greedy"] else f"sampling (temperature {st['temperature']}, top-p {st['top_p']}, " \
        f"top-k {st['top_k']}, seed {st['seed']})"
    L = ["# RACER Studio benchmark", ""]
    if summary.get("interrupted"):
        L += ["> **Interrupted**: the tables cover only the runs that finished "
              f"({summary['runs']['done']}/{summary['runs']['planned']}).", ""]
    L += [f"- **Model**: {summary.get('model')} (`{summary.get('model_spec')}`), {summary.get('device')}, "
          f"{summary.get('dtype')}",
          f"- **Hardware**: {summary.get('hardware')}" + (f"; {m.get('memory_gb')} GB RAM" if m.get("memory_gb") else ""),
          f"- **Data**: {data.get('path', '?')}: {data.get('questions_run', '?')} questions, "
          f"{summary['tokens_vs_time'].get('turns', '?')} turns run by every method; turns: {data.get('turns', 'all')}",
          f"- **Decoding**: {mode}, max {st['max_new_tokens']} new tokens, draft capacity {st['capacity']}, "
          f"{st['repeats']} repeat(s) (median), {st['warmup']} warm-up pass(es)",
          f"- **Versions**: " + ", ".join(f"{k} {v}" for k, v in ver.items() if v),
          f"- **Created**: {summary.get('created')}" + (f", git {m['git']['commit'][:10]}"
                                                        f"{' (dirty)' if m['git'].get('dirty') else ''}"
                                                        if m.get("git") else ""),
          ""]
    if summary.get("command"):
        L += ["```", summary["command"], "```", ""]
    L += ["## Overall", "",
          "MAT = generated tokens per verification forward (the prefill counts as one). Speedup = tokens/s "
          "ratio over the turns both methods finished (total tokens / total time; with identical outputs, the "
          "ratio of total times); without prefill = the same with each turn's prefill, the same work for "
          "every method, taken off its time: the decoding alone. Spec-Bench speedup = the mean over questions "
          "of per-question tokens/s over "
          "the baseline's mean, as Spec-Bench's evaluation/speed.py computes it and papers quote it (every "
          "question weighs the same). "
          "`hf` is transformers' `generate()`, `hf-pld` its prompt lookup (10 tokens). ms/step = decode time "
          "per step after the first token; draft / forward / update = mean ms per verification step of the "
          "decode loop.", "", overall_table(summary), "",
          "## Per category: MAT / speedup vs ar", "", category_table(summary, "speedup_vs_ar"), ""]
    if any(d["overall"].get("specbench_speedup_vs_ar") is not None for d in summary["methods"].values()):
        L += ["## Per category: MAT / Spec-Bench speedup vs ar", "",
              category_table(summary, "specbench_speedup_vs_ar"), ""]
    if any(d["overall"].get("speedup_vs_hf") is not None for d in summary["methods"].values()):
        L += ["## Per category: MAT / speedup vs hf generate()", "", category_table(summary, "speedup_vs_hf"), ""]
    if summary.get("bandwidth"):
        L += ["## How close to the machine's limit", "", bandwidth_section(summary), ""]
    L += ["## Identical outputs", "", identical_section(summary)]
    L += ["## Plots", ""]
    titles = {"benchmark": "MAT and speedup per category and method",
              "acceptance": "Tokens committed per step (acceptance-length histogram)",
              "latency": "Decode latency per generated token",
              "tokens_vs_time": "Tokens against time",
              "cost_curve": "Hardware cost curve: verify-forward ms against tree size T"}
    captions = {
        "acceptance": "Methods that commit one token per step (`ar`, `hf`) are left out.",
        "latency": "Prefill excluded. Decode-loop methods: draft / forward / verify / cache / update (/ sizing) as "
                   "timed by the loop, `overhead` = the rest of their wall time; `hf`, `hf-pld`: `generate` = "
                   "generate() after its first token (not broken down).",
        "tokens_vs_time": "The turns every method finished, back to back in benchmark order; each method on its "
                          "own clock.",
    }
    for name in PLOTS:
        p = plots.get(name)
        if not p:
            continue
        L += [f"### {titles[name]}", ""]
        if captions.get(name):
            L += [captions[name], ""]
        if p.get("png"):
            L.append(f"![{titles[name]}]({p['png']})")
            L.append("")
        L += [f"Interactive: [{p['html']}]({p['html']})", ""]
        if name == "cost_curve":
            L += [cost_section(summary)]
    if not plots:
        L += ["No plots drawn with this report: `python -m visuals.bench_figures DIR` adds them.", ""]
    if "cost_curve" not in plots:
        L += ["### Hardware cost curve", "", cost_section(summary)]
    if summary.get("skipped"):
        L += ["## Skipped", "", _table(["question", "line", "turn", "reason"],
                                       [[str(s.get("question_id", "–")), str(s.get("line", "–")), str(s.get("turn", "–")),
                                         s["reason"]] for s in summary["skipped"]]), ""]
    if summary.get("errors"):
        L += ["## Errors", "", _table(["method", "question", "turn", "error"],
                                      [[f"`{e['method']}`", str(e["question_id"]), str(e["turn"]), e["error"]]
                                       for e in summary["errors"]]), ""]
    if notes:
        L += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(L)


def write_report(out_dir: str | Path, summary: dict[str, Any], figures: Mapping[str, Any] | None = None,
                 images: bool = True) -> dict[str, Any]:
    """Write report.md into out_dir, and plots/NAME.html (+ .png) for each of `figures`; returns
    {"plots", "notes"}."""
    out = Path(out_dir)
    notes: list[str] = []
    figs = {n: f for n, f in (figures or {}).items() if n in PLOTS}
    pdir = out / "plots"
    if figs:
        pdir.mkdir(parents=True, exist_ok=True)
    plots: dict[str, dict[str, str | None]] = {}
    for name, fig in figs.items():
        html = pdir / f"{name}.html"
        # "directory": one plotly.min.js beside the pages, loaded locally: offline, and each page stays small.
        fig.write_html(str(html), include_plotlyjs="directory", full_html=True)
        plots[name] = {"html": f"plots/{name}.html", "png": None}
    if images and figs:
        paths = {n: pdir / f"{n}.png" for n in figs}
        err = write_images(figs, paths)
        if err:
            notes.append(f"PNG rendering failed ({err}); the interactive HTML plots are complete")
        for n in figs:
            if paths[n].is_file():
                plots[n]["png"] = f"plots/{n}.png"
    elif figs and not images:
        notes.append("PNG rendering was switched off (--no-images); see the HTML plots")
    (out / "report.md").write_text(render_markdown(summary, plots, notes), encoding="utf-8")
    return {"plots": plots, "notes": notes}
