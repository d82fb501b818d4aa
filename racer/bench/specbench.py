"""Spec-Bench's answer files and its speed-up, from a benchmark's results rows.

Spec-Bench (github.com/hemingkx/Spec-Bench) writes one JSONL answer file per method, one line
per question with every turn of it:

    {"question_id", "category", "answer_id", "model_id", "tstamp",
     "choices": [{"index": 0, "turns": [text per turn], "decoding_steps": [per turn],
                  "new_tokens": [per turn], "wall_time": [seconds per turn],
                  "accept_lengths": [tokens committed per step, all turns in order]}]}

Its `evaluation/equal.py` compares `choices[0].turns` line by line between two files; its
`evaluation/speed.py` takes, per question, sum(new_tokens) / sum(wall_time) (for the baseline
file it re-tokenizes the turn texts instead of reading new_tokens), averages that over the
questions of each file, and reports the ratio of the two averages as the speed-up. That is
the figure papers quote; it weighs every question alike, where racer's report's own
"speedup vs ar" is total tokens / total time (every token alike). `specbench_speedup` computes
Spec-Bench's figure from the token counts the benchmark recorded.
"""
from __future__ import annotations

import hashlib
import json
import re
import statistics
import time
from pathlib import Path
from typing import Any, Iterable, Sequence

FORMAT = "spec-bench"


def _by_question(rows: Iterable[dict[str, Any]]) -> dict[Any, list[dict[str, Any]]]:
    out: dict[Any, list[dict[str, Any]]] = {}
    for r in rows:
        out.setdefault(r["question_id"], []).append(r)
    for turns in out.values():
        turns.sort(key=lambda r: r["turn"])
    return out


def _question_speed(turns: Sequence[dict[str, Any]]) -> float | None:
    wall = sum(r["wall_s"] for r in turns)
    return sum(r["new_tokens"] for r in turns) / wall if wall > 0 else None


def specbench_speedup(rows: Sequence[dict[str, Any]], base_rows: Sequence[dict[str, Any]]) -> float | None:
    """Spec-Bench's speed-up of one method's rows over a baseline's: the mean over questions of
    per-question tokens/s (all turns of a question together), divided by the baseline's mean.
    Only questions both finished with the same turns count, so both means cover the same set."""
    mine, base = _by_question(rows), _by_question(base_rows)
    speeds, speeds0 = [], []
    for qid, turns in mine.items():
        other = base.get(qid)
        if not other or [r["turn"] for r in turns] != [r["turn"] for r in other]:
            continue
        s, s0 = _question_speed(turns), _question_speed(other)
        if s is None or s0 is None:
            continue
        speeds.append(s)
        speeds0.append(s0)
    if not speeds or statistics.fmean(speeds0) <= 0:
        return None
    return round(statistics.fmean(speeds) / statistics.fmean(speeds0), 4)


def model_id(model: str, method: str, dtype: str, temperature: float) -> str:
    """A Spec-Bench-style model id (its files are named `<model id>.jsonl`, e.g.
    `vicuna-7b-v1.3-vanilla-float16-temp-0.0`), safe as a file name."""
    raw = f"{Path(str(model)).name}-{method}-{dtype}-temp-{float(temperature)}"
    return re.sub(r"[^A-Za-z0-9._@-]+", "-", raw)


def answer_line(question: Sequence[dict[str, Any]], mid: str, tstamp: float) -> dict[str, Any]:
    """One question's answer line from its results rows (one per turn, in turn order)."""
    first = question[0]
    accept: list[int] = []
    for r in question:
        # Unknown per-step lengths stay unknown (an empty list), not made up; speed.py only averages them.
        accept.extend(int(n) for n in (r.get("accept_lengths") or []))
    steps = [r.get("steps") for r in question]
    # A stable id from what identifies the answer (Spec-Bench draws a random one; nothing reads it).
    aid = hashlib.sha1(f"{mid}|{first['question_id']}".encode()).hexdigest()[:22]
    return {
        "question_id": first["question_id"], "category": first["category"], "answer_id": aid, "model_id": mid,
        "choices": [{"index": 0, "turns": [r["text"] for r in question],
                     "decoding_steps": [int(s) if s is not None else None for s in steps],
                     "new_tokens": [int(r["new_tokens"]) for r in question],
                     "wall_time": [float(r["wall_s"]) for r in question],
                     "accept_lengths": accept}],
        "tstamp": tstamp,
    }


def export(results: Sequence[dict[str, Any]], out_dir: str | Path, *, model: str, dtype: str,
           temperature: float, methods: Sequence[str] | None = None) -> dict[str, Any]:
    """Write `<out_dir>/<model id>.jsonl` per method in Spec-Bench's answer format.

    Every file holds the same questions, in benchmark order: those every method finished with
    the same turns (Spec-Bench's speed.py averages each file on its own, so a question missing
    from one file would skew the ratio). Returns {"files": {method: path}, "questions": n,
    "left_out": [question ids not in every method's results]}."""
    names = list(methods) if methods is not None else list(dict.fromkeys(r["method"] for r in results))
    per = {m: _by_question(r for r in results if r["method"] == m) for m in names}
    order = list(dict.fromkeys(r["question_id"] for r in results))
    keep, left_out = [], []
    for qid in order:
        turns = [tuple(r["turn"] for r in per[m].get(qid, [])) for m in names]
        if turns and turns[0] and all(t == turns[0] for t in turns):
            keep.append(qid)
        else:
            left_out.append(qid)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files: dict[str, str] = {}
    now = time.time()
    for m in names:
        mid = model_id(model, m, dtype, temperature)
        path = out / f"{mid}.jsonl"
        with open(path, "w", encoding="utf-8") as fh:
            for qid in keep:
                fh.write(json.dumps(answer_line(per[m][qid], mid, now), ensure_ascii=False) + "\n")
        files[m] = str(path)
    return {"files": files, "questions": len(keep), "left_out": left_out}
