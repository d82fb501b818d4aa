"""From results rows to summary.json: per-method and per-category MAT, tokens/s and speedups,
the identical-output accounting against ar, the machine, and the curves the report draws.

Definitions (over the (question, turn) pairs a method finished):
* MAT = generated tokens / decoding steps (each step is one verification forward; the first
  is the prefill). Unknown (null) where a method's steps are unknown.
* tokens/s = generated tokens / wall time (median over repeats of each turn).
* speedup vs B = (tokens / time of the method) / (tokens / time of B), both summed over the
  pairs both finished. With identical outputs (greedy) this is exactly B's total time over
  the method's total time.
* speedup vs ar without the prefill (`decode_speedup_vs_ar`) = the same ratio with each turn's
  prefill taken off its wall time: the decoding alone. The prefill is the same work for every
  method and weighs more in a faster method's time, so it pulls every speed-up towards 1 (on
  Spec-Bench, 10 per category, it was 13 % of `racer`'s time and 6 % of `ar`'s).
* Spec-Bench speedup vs B (`specbench_speedup_vs_*`) = the mean over questions of per-question
  tokens/s (all turns of a question together) over B's mean, as Spec-Bench's
  evaluation/speed.py computes it and papers quote it (racer.bench.specbench): every question
  weighs the same, so short fast answers count as much as long ones.
* Identical-output check (greedy only): every method's tokens against ar's on the same
  question and turn. For each difference: the first differing position, ar's top-2 logit
  margin there (ar's own logits: its prompt's prefill, then its tokens one by one through the KV
  cache, as it decoded them), and the gap between ar's token and the method's token. A gap within
  the dtype's rounding (`tie_tolerance`) is a floating-point tie (the tree forward sums in a
  different order); anything larger is a bug.
"""
from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch

from ..kvcache import new_cache
from ..models import LoadedModel
from ..records import mean_accepted
from .methods import PLD_TOKENS
from .runner import BenchRun, BenchSettings, RunRecord
from .specbench import specbench_speedup

REFERENCE = "ar"
PEER = "hf"
FORMAT = "racer-bench/1"
LOOP_PHASES = ("draft", "forward", "verify", "cache", "update", "sizing")


def tie_tolerance(dtype: torch.dtype) -> float:
    """Largest logit gap still read as a floating-point tie, by dtype (logits are O(10))."""
    return {torch.float32: 0.01, torch.float16: 0.1, torch.bfloat16: 0.25}.get(dtype, 0.25)


# -- aggregation -----------------------------------------------------------------------------

def _key(r: dict[str, Any]) -> tuple[str, int]:
    return (str(r["question_id"]), int(r["turn"]))


def aggregate(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Totals and means over some rows of one method."""
    n = len(rows)
    tokens = sum(r["new_tokens"] for r in rows)
    wall = sum(r["wall_s"] for r in rows)
    steps_known = all(r.get("steps") is not None for r in rows) and n > 0
    steps = sum(r["steps"] for r in rows) if steps_known else None
    fw_known = all(r.get("forwards") is not None for r in rows) and n > 0
    forwards = sum(r["forwards"] for r in rows) if fw_known else None
    out: dict[str, Any] = {
        "turns": n, "new_tokens": tokens, "wall_s": round(wall, 6),
        "tokens_per_s": round(tokens / wall, 3) if wall > 0 else None,
        "steps": steps, "forwards": forwards,
        "mat": round(mean_accepted(tokens, forwards), 4) if forwards else None,
    }
    prefills = [r["prefill_ms"] for r in rows if r.get("prefill_ms") is not None]
    out["prefill_ms"] = round(statistics.fmean(prefills), 3) if prefills else None
    # Decode time per step after the first token, comparable across every method.
    if steps_known and steps and steps > n:
        dec = sum(r["wall_s"] * 1e3 - (r.get("prefill_ms") or 0.0) for r in rows)
        out["ms_per_step"] = round(dec / (steps - n), 3)
    else:
        out["ms_per_step"] = None
    # Per-step phases (decode-loop methods): mean ms per verification forward.
    loop_rows = [r for r in rows if r.get("step_ms")]
    if loop_rows:
        forwards = sum(sum(1 for s in (r.get("tree_sizes") or []) if s) for r in loop_rows)
        for p in LOOP_PHASES:
            tot = sum(sum(r["step_ms"].get(p) or []) for r in loop_rows)
            if p in ("draft", "forward", "update") or tot:
                out[f"{p}_ms"] = round(tot / forwards, 4) if forwards else None
        sizes = [s for r in loop_rows for s in (r.get("tree_sizes") or []) if s]
        out["tree_nodes"] = round(statistics.fmean(sizes), 2) if sizes else None
    return out


def speedup(rows: Sequence[dict[str, Any]], base: dict[tuple[str, int], dict[str, Any]],
            without_prefill: bool = False) -> float | None:
    """Throughput ratio against a baseline over the pairs both finished; `without_prefill`: with
    each turn's prefill taken off its wall time (None unless every pair has one)."""
    pairs = [(r, base[_key(r)]) for r in rows if _key(r) in base]
    if not pairs or (without_prefill and any(x.get("prefill_ms") is None for pair in pairs for x in pair)):
        return None

    def took(r: dict[str, Any]) -> float:
        return r["wall_s"] - (r["prefill_ms"] / 1e3 if without_prefill else 0.0)

    t_m = sum(took(r) for r, _ in pairs)
    t_b = sum(took(b) for _, b in pairs)
    n_m = sum(r["new_tokens"] for r, _ in pairs)
    n_b = sum(b["new_tokens"] for _, b in pairs)
    if t_m <= 0 or t_b <= 0 or n_b == 0:
        return None
    return round((n_m / t_m) / (n_b / t_b), 4)


# -- identical outputs -----------------------------------------------------------------------

def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return None if len(a) == len(b) else n


@torch.inference_mode()
def next_logits(lm: LoadedModel, prompt: Sequence[int], tokens: Sequence[int]) -> torch.Tensor:
    """Float32 next-token logits after `prompt` + `tokens` as plain greedy decoding computed them:
    the prompt in one prefill, then one token per forward through the KV cache. One forward over
    the whole sequence would run the prefill path, whose rounding differs: at a bfloat16 tie it
    read the margin up to two steps off (0.375 where decoding's own was 0.125)."""
    cache = new_cache(lm.model)
    out = lm.model(input_ids=torch.tensor([list(prompt)], dtype=torch.long, device=lm.device), cache=cache,
                   use_cache=True, logits_to_keep=1)
    for t in tokens:
        out = lm.model(input_ids=torch.tensor([[int(t)]], dtype=torch.long, device=lm.device), cache=cache,
                       use_cache=True)
    return out.logits[0, -1].float().cpu()


def compare_outputs(lm: LoadedModel | None, results: Sequence[dict[str, Any]], record: RunRecord,
                    reference: str = REFERENCE, tolerance: float | None = None) -> dict[str, dict[str, Any]]:
    """Per method: how many answers equal the reference's, and what each difference looks like."""
    tol = tolerance if tolerance is not None else (tie_tolerance(lm.dtype) if lm is not None else 0.01)
    ref = {_key(r): r for r in results if r["method"] == reference}
    methods = []
    for r in results:
        if r["method"] != reference and r["method"] not in methods:
            methods.append(r["method"])
    out: dict[str, dict[str, Any]] = {}
    for m in methods:
        acc = {"compared": 0, "identical": 0, "ties": 0, "mismatches": 0, "inherited": 0, "length": 0,
               "differences": []}
        for r in results:
            if r["method"] != m or _key(r) not in ref:
                continue
            a, b = ref[_key(r)]["token_ids"], r["token_ids"]
            acc["compared"] += 1
            pos = first_difference(a, b)
            if pos is None:
                acc["identical"] += 1
                continue
            same_prompt = record.same_prompt.get((r["question_id"], r["turn"], m), True)
            d: dict[str, Any] = {"question_id": r["question_id"], "category": r["category"], "turn": r["turn"],
                                 "position": pos, "ar_token": a[pos] if pos < len(a) else None,
                                 "method_token": b[pos] if pos < len(b) else None, "same_prompt": same_prompt,
                                 "ar_len": len(a), "method_len": len(b)}
            prompt = record.ref_prompts.get(_key(r))
            if lm is not None and prompt is not None and pos < len(a):
                logits = next_logits(lm, prompt, a[:pos])
                top = torch.topk(logits, 2)
                d["margin_top2"] = round(float(top.values[0] - top.values[1]), 5)
                if pos < len(b):
                    tok = int(b[pos])
                    d["gap"] = round(float(logits[int(a[pos])] - logits[tok]), 5)
                    d["method_token_rank"] = int((logits > logits[tok]).sum().item())
            if not same_prompt:
                verdict = "inherited"      # an earlier turn already differed: a different conversation
            elif d["ar_token"] is None or d["method_token"] is None:
                verdict = "length"         # one is a prefix of the other
            elif "gap" in d and d["gap"] <= tol:
                verdict = "tie"
            else:
                verdict = "mismatch"
            d["verdict"] = verdict
            acc[{"tie": "ties", "mismatch": "mismatches"}.get(verdict, verdict)] += 1
            acc["differences"].append(d)
        out[m] = acc
    return out


# -- curves ----------------------------------------------------------------------------------

def _downsample(points: list[tuple[float, int]], limit: int) -> list[tuple[float, int]]:
    if len(points) <= limit:
        return points
    step = len(points) / limit
    keep = [points[int(i * step)] for i in range(limit)]
    if keep[-1] != points[-1]:
        keep.append(points[-1])
    return keep


def timelines(results: Sequence[dict[str, Any]], methods: Sequence[str], limit: int = 400) -> dict[str, Any]:
    """Tokens against each method's own time, over the (question, turn) pairs every method
    finished, run back to back in benchmark order. Steps inside a turn come from its trace."""
    by_m: dict[str, dict[tuple[str, int], dict[str, Any]]] = {m: {} for m in methods}
    order: list[tuple[str, int]] = []
    for r in results:
        if r["method"] in by_m:
            by_m[r["method"]][_key(r)] = r
            if _key(r) not in order:
                order.append(_key(r))
    common = [k for k in order if all(k in by_m[m] for m in methods)]
    out: dict[str, Any] = {}
    for m in methods:
        pts: list[tuple[float, int]] = [(0.0, 0)]
        t_off, n_off = 0.0, 0
        for k in common:
            r = by_m[m][k]
            el = r.get("elapsed_ms") or []
            lens = r.get("accept_lengths")
            if lens and len(lens) == len(el):
                cum = 0
                for e, n in zip(el, lens):
                    cum += n
                    pts.append((t_off + e / 1e3, n_off + cum))
            pts.append((t_off + r["wall_s"], n_off + r["new_tokens"]))
            t_off += r["wall_s"]
            n_off += r["new_tokens"]
        pts = _downsample(pts, limit)
        fw = sum(by_m[m][k]["forwards"] or 0 for k in common) \
            if all(by_m[m][k].get("forwards") for k in common) else None
        out[m] = {"points": [[round(t, 4), n] for t, n in pts],
                  "final": {"tokens_per_s": round(n_off / t_off, 3) if t_off > 0 else None,
                            "mat": round(mean_accepted(n_off, fw), 4) if fw else None, "tokens": n_off,
                            "time_s": round(t_off, 4)}}
    return {"turns": len(common), "methods": out}


def accept_histogram(rows: Sequence[dict[str, Any]]) -> dict[str, int] | None:
    if not rows or any(r.get("accept_lengths") is None for r in rows):
        return None
    c = Counter(n for r in rows for n in r["accept_lengths"])
    return {str(k): c[k] for k in sorted(c)}


def latency_totals(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Decode-phase totals (ms) without the prefill; for decode-loop methods the time outside the
    timed phases (drafter set-up, Python between steps) is `overhead_ms`, so each bar adds up to
    the wall time minus the prefill, as generate()'s single `generate_ms` does."""
    tot: dict[str, float] = {}
    for r in rows:
        timings = r.get("timings") or {}
        for k, v in timings.items():
            tot[k] = tot.get(k, 0.0) + float(v)
        if r.get("step_ms"):
            rest = r["wall_s"] * 1e3 - (r.get("prefill_ms") or 0.0) - sum(float(v) for v in timings.values())
            tot["overhead_ms"] = tot.get("overhead_ms", 0.0) + max(0.0, rest)
    return {"timings": {k: round(v, 3) for k, v in tot.items()}, "steps": sum(r.get("steps") or 0 for r in rows),
            "new_tokens": sum(r["new_tokens"] for r in rows),
            "prefill_ms": round(sum(r.get("prefill_ms") or 0.0 for r in rows), 3)}


# -- machine ---------------------------------------------------------------------------------

def _cpu_name() -> str:
    """The CPU's model name, with its family and model numbers where the kernel gives them: a
    virtual machine may name every generation "AMD EPYC", and an AVX2 Zen 1 (family 23 model 1,
    256-bit FMAs as two halves) multiplies at half the rate of a Zen 2 (family 23 model 49)."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if not key.strip():
                break  # the first processor's block is enough
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    name = fields.get("model name") or platform.processor() or platform.machine()
    if "cpu family" in fields and "model" in fields:
        name += f" (family {fields['cpu family']} model {fields['model']})"
    return name


def _version(pkg: str) -> str | None:
    try:
        from importlib.metadata import version
        return version(pkg)
    except Exception:  # noqa: BLE001
        return None


def _git() -> dict[str, Any] | None:
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=5)
        return {"commit": head.stdout.strip(), "dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return None


def machine_info(lm: LoadedModel) -> dict[str, Any]:
    from .. import __version__
    info: dict[str, Any] = {
        "cpu": _cpu_name(), "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(), "python": sys.version.split()[0],
    }
    try:
        import psutil
        info["memory_gb"] = round(psutil.virtual_memory().total / 2**30, 1)
    except Exception:  # noqa: BLE001
        pass
    if lm.device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(lm.device)
        info["cuda"] = torch.version.cuda
    versions = {"racer": __version__, "torch": torch.__version__}
    for pkg in ("transformers", "numpy", "plotly", "kaleido"):
        versions[pkg] = _version(pkg)
    info["versions"] = versions
    g = _git()
    if g:
        info["git"] = g
    return info


def hardware_label(lm: LoadedModel, machine: dict[str, Any]) -> str:
    if lm.device.type == "cuda":
        return f"{machine.get('gpu', 'GPU')}, {str(lm.dtype).replace('torch.', '')}"
    n = machine["torch_threads"]
    return f"{machine['cpu']}, {n} thread{'s' if n != 1 else ''}, {str(lm.dtype).replace('torch.', '')}"


# -- the summary -----------------------------------------------------------------------------

def build_summary(lm: LoadedModel | None, run: BenchRun, *, command: str | None = None, data: dict[str, Any] | None = None,
                  cost_curve: dict[str, Any] | None = None, compare: bool = True,
                  machine: dict[str, Any] | None = None) -> dict[str, Any]:
    st: BenchSettings = run.settings
    results = run.results
    methods = [m for m in run.methods if any(r["method"] == m for r in results)] or list(run.methods)
    by_m = {m: [r for r in results if r["method"] == m] for m in methods}
    base = {b: {_key(r): r for r in by_m.get(b, [])} for b in (REFERENCE, PEER)}
    cats: list[str] = []
    for r in results:
        if r["category"] not in cats:
            cats.append(r["category"])

    identical = None
    if st.greedy and REFERENCE in by_m and compare:
        identical = compare_outputs(lm, results, run.record)

    def stats(rows: list[dict[str, Any]], m: str, cat: str | None) -> dict[str, Any]:
        s = aggregate(rows)
        s["speedup_vs_ar"] = speedup(rows, base[REFERENCE]) if base[REFERENCE] else None
        s["speedup_vs_hf"] = speedup(rows, base[PEER]) if base[PEER] else None
        s["decode_speedup_vs_ar"] = speedup(rows, base[REFERENCE], without_prefill=True) if base[REFERENCE] else None
        for b in (REFERENCE, PEER):
            s[f"specbench_speedup_vs_{b}"] = specbench_speedup(rows, by_m[b]) if base[b] else None
        if identical is not None:
            if m == REFERENCE:
                s["identical_to_ar"] = len(rows)
            else:
                diffs = {(d["question_id"], d["turn"]) for d in identical[m]["differences"]
                         if cat is None or d["category"] == cat}
                s["identical_to_ar"] = sum(1 for r in rows if _key(r) in base[REFERENCE]) - len(diffs)
        return s

    out_methods: dict[str, Any] = {}
    for m in methods:
        rows = by_m[m]
        d: dict[str, Any] = {"overall": stats(rows, m, None),
                             "categories": {c: stats([r for r in rows if r["category"] == c], m, c)
                                            for c in cats if any(r["category"] == c for r in rows)},
                             "accept_hist": accept_histogram(rows), "latency": latency_totals(rows)}
        if identical is not None and m in identical:
            d["identical"] = identical[m]
        out_methods[m] = d

    machine = machine if machine is not None else (machine_info(lm) if lm is not None else {})
    summary: dict[str, Any] = {
        "format": FORMAT,
        "created": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "command": command,
        "model": lm.name if lm is not None else None,
        "model_spec": lm.spec if lm is not None else None,
        "device": str(lm.device) if lm is not None else None,
        "dtype": str(lm.dtype).replace("torch.", "") if lm is not None else None,
        "model_notes": list(lm.notes) if lm is not None else [],
        "hardware": hardware_label(lm, machine) if lm is not None and machine else None,
        "machine": machine,
        "settings": {"max_new_tokens": st.max_new_tokens, "capacity": st.resolved_capacity(),
                     "temperature": st.temperature, "top_p": st.top_p, "top_k": st.top_k, "seed": st.seed,
                     "repeats": st.repeats, "warmup": st.warmup, "greedy": st.greedy,
                     "hf_pld_tokens": PLD_TOKENS},
        "data": data or {},
        "reference": REFERENCE, "peer": PEER,
        "categories": cats,
        "methods": out_methods,
        "identical_check": None if identical is None else {
            "reference": REFERENCE, "tie_tolerance": tie_tolerance(lm.dtype) if lm is not None else None,
            "ok": all(v["mismatches"] == 0 and v["length"] == 0 for v in identical.values())},
        "tokens_vs_time": timelines(results, methods),
        "cost_curve": cost_curve,
        "skipped": [s.to_dict() for s in run.skipped],
        "errors": list(run.errors),
        "interrupted": run.interrupted,
        "runs": {"planned": run.runs_planned, "done": run.runs_done, "elapsed_s": round(run.elapsed_s, 3)},
    }
    return summary


def context_lengths(results: Iterable[dict[str, Any]]) -> list[int]:
    """Typical contexts the verify forwards saw: 10th, 50th and 90th percentile of each turn's
    mid-generation context (prompt + half the answer)."""
    mids = sorted(r["prompt_len"] + r["new_tokens"] // 2 for r in results)
    if not mids:
        return []
    pick = [mids[min(len(mids) - 1, int(q * len(mids)))] for q in (0.1, 0.5, 0.9)]
    out = sorted({max(8, int(round(p / 8.0)) * 8) for p in pick})
    return out
