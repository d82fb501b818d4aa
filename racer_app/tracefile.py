"""Traces as files: a recorded RACER run exported as JSON and loaded back into the inspector.

A trace file holds everything the inspector shows and replays, so it needs neither the model
nor its tokenizer: the step records with the model's top-k rows (racer.replay rebuilds the
drafter's state from them), how the drafter was started, its settings and the sizer's cost
curve, the text of every token id the trace mentions, and the coloured spans of the generated
text. A static Space with no model can still teach from one (`shipped()` lists those under
assets/traces/).

Token texts are per id (`decode_one` of the run's tokenizer); a passage of several tokens is
their concatenation, which is exact except for a character split over two byte-level tokens
(shown as �). The generated text itself is stored as it was decoded.
"""
from __future__ import annotations

import gzip
import io
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from racer.costcurve import CostCurve
from racer.drafters import METHODS, takes_option
from racer.records import StartRecord, StepRecord
from racer.replay import Turn

from .session import Trace

FORMAT = "racer-studio-trace"
#: 2: the sizer settings `skip_disturbed` and `calibrate` (version 1 sizers calibrated, disturbed or not).
#: 3: the sizer setting `match_run` (earlier sizers judged every chain node alike).
#: 4: the sizer setting `confidence` (earlier sizers did not judge nodes by the model's confidence in the root).
#: 5: the racer drafter setting `cold_agree` (earlier racer drafters did not mark the copy-logit entries
#: the root's cold row agrees with) and the sizer setting `first_pass` (earlier sizers priced every
#: tree at the measured curve).
#: 6: the racer drafter settings `chain_pick` and `long_chain` (earlier racer drafters' chains copied
#: the latest occurrence and stopped at `chain_len` tokens).
VERSION = 6
SHIPPED_DIR = Path(__file__).resolve().parent.parent / "assets" / "traces"


class TraceFileError(ValueError):
    """The file is not a trace this app can read; the message says why."""


@dataclass
class TokenTexts:
    """Token texts from a trace file, standing in for the tokenizer."""
    texts: dict[int, str]
    special: frozenset[int] = frozenset()

    def decode_one(self, t: int) -> str:
        return self.texts.get(int(t), f"⟨{int(t)}⟩")

    def decode_many(self, ids: Iterable[int]) -> str:
        return "".join(self.decode_one(t) for t in ids if int(t) not in self.special)

    def decode_raw(self, ids: Iterable[int]) -> str:
        return "".join(self.decode_one(t) for t in ids)


def token_ids(trace: Trace) -> set[int]:
    """Every token id a trace file's pictures may show."""
    ids: set[int] = set(int(t) for t in trace.prompt_ids)
    for turn in trace.turns or []:
        ids.update(int(t) for t in turn.start.context)
        if turn.start.topk is not None:
            ids.update(int(t) for t in turn.start.topk.ravel())
    for turn_steps in ([t.steps for t in trace.turns] if trace.turns else []) + [trace.steps]:
        for s in turn_steps:
            ids.update(int(t) for t in s.tree.tokens)
            ids.update(int(t) for t in s.committed)
            if s.next_root is not None:
                ids.add(int(s.next_root))
            if s.topk is not None:
                ids.update(int(t) for t in s.topk.ravel())
    ids.discard(-1)
    return ids


def trace_to_dict(trace: Trace, special: Iterable[int] = ()) -> dict[str, Any]:
    spans, step_of = trace.spans()
    ids = sorted(token_ids(trace))
    turns = trace.turns or []
    # Steps are stored once: the last turn's are the trace's own.
    return {
        "format": FORMAT, "version": VERSION, "exported": time.strftime("%Y-%m-%d %H:%M:%S"),
        "title": trace.title, "source": trace.source, "model": trace.model, "settings": dict(trace.settings),
        "stop_reason": trace.stop_reason, "detail_steps": trace.detail_steps, "summary": dict(trace.summary),
        "prompt_ids": [int(t) for t in trace.prompt_ids],
        "steps": [s.to_dict() for s in trace.steps],
        "turns": [{"start": t.start.to_dict(), "steps": [s.to_dict() for s in t.steps] if i < len(turns) - 1 else None}
                  for i, t in enumerate(turns)],
        "drafter": trace.drafter, "sizer": trace.sizer,
        "cost_curve": trace.cost_curve.to_dict() if trace.cost_curve is not None else None,
        "tokens": {str(t): trace.decode_one(t) for t in ids},
        "special": sorted(int(t) for t in special if int(t) in set(ids)),
        "spans": [[text, label] for text, label in spans], "span_steps": list(step_of),
    }


#: What a trace file may ask of the replay: every bound is far above what the app records, and
#: keeps a hostile file from asking for a gigabyte copy-logit table or a runaway draft.
MAX_VOCAB = 1 << 20
MAX_NODES = 4096
#: Steps a trace may ask the inspector to replay (a chat of 12 turns of 1,024 tokens is less).
MAX_STEPS = 16_384
_OPTION_BOUNDS = {"capacity_automaton": (11, 100_000), "window": (2, 64), "topk": (1, 64), "chain_len": (1, 64),
                  "long_chain": (0, 64), "long_run": (1, 64)}
_OPTION_CHOICES = {"breadth_rule": ("paper", "released"), "merge": ("merge", "half", "hard"),
                   "chain_pick": ("recent", "run")}
_OPTION_FLAGS = ("retrieval", "logits", "lookup_chain", "row_probs", "cold_agree")


def _check_replay_settings(drafter: Any, sizer: Any) -> None:
    """TraceFileError unless the drafter and sizer settings are ones this app could have recorded."""
    if drafter is None:
        return
    if not isinstance(drafter, dict) or drafter.get("method") not in METHODS:
        raise TraceFileError("the trace names no drafter this app knows")
    v = drafter.get("vocab_size")
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_VOCAB:
        raise TraceFileError(f"the trace's vocabulary size {v!r} is out of range")
    for k, val in (drafter.get("options") or {}).items():
        if k in _OPTION_BOUNDS:
            lo, hi = _OPTION_BOUNDS[k]
            ok = isinstance(val, int) and not isinstance(val, bool) and lo <= val <= hi
        elif k in _OPTION_CHOICES:
            ok = val in _OPTION_CHOICES[k]
        else:
            ok = k in _OPTION_FLAGS and isinstance(val, bool)
        if not ok:
            raise TraceFileError(f"the trace's drafter setting {k}={val!r} is not one this app records")
    if sizer is None:
        return
    if not isinstance(sizer, dict) or not set(sizer) <= {"max_size", "pool_factor", "burst", "skip_disturbed", "calibrate",
                                                           "match_run", "confidence", "first_pass"}:
        raise TraceFileError("the trace's sizer settings are not valid")
    ms, pf, fp = sizer.get("max_size"), sizer.get("pool_factor", 2), sizer.get("first_pass", 0)
    if (ms is not None and not (isinstance(ms, int) and 1 <= ms <= 1024)) or not (isinstance(pf, int) and 1 <= pf <= 8) \
            or fp is not None and not (isinstance(fp, int) and not isinstance(fp, bool) and 0 <= fp <= 64) \
            or not all(isinstance(sizer.get(k, True), bool) for k in ("burst", "skip_disturbed", "calibrate", "match_run",
                                                                                  "confidence")):
        raise TraceFileError("the trace's sizer settings are out of range")


def _need(d: dict[str, Any], key: str, kind: type) -> Any:
    if not isinstance(d.get(key), kind):
        raise TraceFileError(f"the trace has no valid '{key}'")
    return d[key]


def trace_from_dict(d: Any) -> Trace:
    """A Trace from `trace_to_dict`'s output; TraceFileError when it is not one."""
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise TraceFileError("this is not a RACER Studio trace (no 'format': 'racer-studio-trace')")
    if int(d.get("version") or 0) > VERSION:
        raise TraceFileError(f"the trace is format version {d.get('version')}; this app reads up to {VERSION}")
    try:
        steps = [StepRecord.from_dict(s) for s in _need(d, "steps", list)]
        if not steps:
            raise TraceFileError("the trace has no steps")
        for s in steps:
            s.tree.validate()
            if len(s.tree) > MAX_NODES or not 0 <= s.capacity <= MAX_NODES:
                raise TraceFileError(f"step {s.index + 1} asks for a tree of more than {MAX_NODES} nodes")
        sizer = d.get("sizer")
        _check_replay_settings(d.get("drafter"), sizer)
        version = int(d.get("version") or 0)
        if sizer is not None and version < 2:
            # Version 1 was recorded by a sizer that calibrated and learnt from disturbed forwards too.
            sizer = {**sizer, "skip_disturbed": False, "calibrate": True}
        if sizer is not None and version < 3:
            sizer = {**sizer, "match_run": False}
        if sizer is not None and version < 4:
            sizer = {**sizer, "confidence": False}
        if sizer is not None and version < 5:
            sizer = {**sizer, "first_pass": 0}
        drafter = d.get("drafter")
        if drafter is not None and version < 5 and takes_option(drafter.get("method"), "cold_agree"):
            drafter = {**drafter, "options": {**(drafter.get("options") or {}), "cold_agree": False}}
        if drafter is not None and version < 6 and takes_option(drafter.get("method"), "chain_pick"):
            drafter = {**drafter, "options": {"chain_pick": "recent", "long_chain": 0, **(drafter.get("options") or {})}}
        turns = None
        raw_turns = d.get("turns") or []
        if raw_turns:
            turns = []
            for i, t in enumerate(raw_turns):
                last = i == len(raw_turns) - 1
                turn_steps = steps if last else [StepRecord.from_dict(s) for s in t.get("steps") or []]
                turns.append(Turn(StartRecord.from_dict(t["start"]), turn_steps))
        if sum(len(t.steps) for t in turns or []) > MAX_STEPS:
            raise TraceFileError(f"the trace has more than {MAX_STEPS} steps to replay")
        texts = TokenTexts({int(k): str(v) for k, v in _need(d, "tokens", dict).items()},
                           frozenset(int(t) for t in d.get("special") or []))
        curve = CostCurve(**d["cost_curve"]) if d.get("cost_curve") else None
        trace = Trace(steps, [int(t) for t in _need(d, "prompt_ids", list)], texts.decode_one, texts.decode_many,
                      source=str(d.get("source") or "file"), title=str(d.get("title") or ""),
                      model=str(d.get("model") or ""), settings=dict(d.get("settings") or {}),
                      detail_steps=min(int(d.get("detail_steps") or 0), len(steps)), stop_reason=d.get("stop_reason"),
                      summary=dict(d.get("summary") or {}), cost_curve=curve, turns=turns,
                      drafter=drafter, sizer=sizer, origin="file")
        spans = d.get("spans")
        if isinstance(spans, list) and isinstance(d.get("span_steps"), list):
            trace._spans = ([(str(t), lab) for t, lab in spans], [int(k) for k in d["span_steps"]])
        return trace
    except TraceFileError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, AssertionError) as e:
        raise TraceFileError(f"the trace file is damaged: {e.__class__.__name__}: {e}") from e


def save(trace: Trace, path: str | Path, special: Iterable[int] = ()) -> Path:
    """Write `trace` to `path` (gzip-compressed when the name ends in .gz)."""
    path = Path(path)
    data = json.dumps(trace_to_dict(trace, special), ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    path.write_bytes(gzip.compress(data, mtime=0) if path.suffix == ".gz" else data)
    return path


def load(source: str | Path | bytes, max_bytes: int = 64 * 2**20) -> Trace:
    """Read a trace file (plain or gzip-compressed JSON); TraceFileError with a reason."""
    try:
        raw = source if isinstance(source, bytes) else Path(source).read_bytes()
    except OSError as e:
        raise TraceFileError(f"the file could not be read: {e}") from e
    if raw[:2] == b"\x1f\x8b":
        try:
            with gzip.GzipFile(fileobj=io.BytesIO(raw)) as f:
                raw = f.read(max_bytes + 1)
        except (OSError, EOFError) as e:
            raise TraceFileError(f"the file is not valid gzip: {e}") from e
    if len(raw) > max_bytes:
        raise TraceFileError(f"the trace is larger than {max_bytes // 2**20} MB unpacked")
    try:
        d = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TraceFileError(f"the file is not JSON: {e}") from e
    return trace_from_dict(d)


def shipped_index() -> list[dict[str, Any]]:
    """The shipped traces (assets/traces/index.json, written by scripts/make_traces.py), each
    with its file's path; those whose file is missing are left out."""
    try:
        rows = json.loads((SHIPPED_DIR / "index.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    out = []
    for r in rows if isinstance(rows, list) else []:
        if isinstance(r, dict) and (SHIPPED_DIR / str(r.get("file"))).is_file():
            out.append(dict(r, path=SHIPPED_DIR / str(r["file"])))
    return out


def load_shipped(path: str | Path) -> Trace:
    """A shipped trace (see `shipped`), marked as one."""
    trace = load(path)
    trace.origin = "shipped"
    return trace


def shipped() -> list[tuple[str, Path]]:
    """The traces that ship with the app: (title, path)."""
    return [(str(r.get("title") or r["file"]), r["path"]) for r in shipped_index()]
