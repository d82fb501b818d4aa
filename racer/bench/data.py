"""Benchmark input: JSONL rows of {question_id, category, turns}, as in Spec-Bench.

`turns` are the user messages of one conversation; each answer is appended before the next
turn. Rows that cannot be used are never dropped silently: `load_rows` returns them as
`Skipped` records with the line number and the reason.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

#: The project's own prompts (40 rows, 8 categories), shipped so the benchmark runs on a fresh machine.
DEFAULT_DATA = Path(__file__).resolve().parents[2] / "assets" / "bench_prompts.jsonl"


@dataclass
class Row:
    question_id: str
    category: str
    turns: list[str]
    #: A system prompt before the first turn ("" for none; Spec-Bench has none).
    system: str = ""

    def messages(self, history: list[dict[str, str]], user: str) -> list[dict[str, str]]:
        """The chat a turn sends: the system prompt (if any), the turns so far, then `user`."""
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + history + [{"role": "user", "content": user}]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Skipped:
    """A row (or one turn of it) the benchmark did not run, and why."""
    question_id: str | None
    reason: str
    line: int | None = None
    turn: int | None = None
    category: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = {"question_id": self.question_id, "category": self.category, "line": self.line, "turn": self.turn,
             "reason": self.reason}
        d.update(self.extra)
        return {k: v for k, v in d.items() if v is not None}


def parse_row(obj: Any) -> Row:
    """A validated Row, or ValueError saying what is wrong."""
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    if "question_id" not in obj or obj["question_id"] in (None, ""):
        raise ValueError("no question_id")
    qid = obj["question_id"]
    if not isinstance(qid, (str, int)) or isinstance(qid, bool):
        raise ValueError("question_id must be a string or a number")
    cat = obj.get("category", "")
    if not isinstance(cat, str) or not cat.strip():
        raise ValueError("no category")
    turns = obj.get("turns")
    if isinstance(turns, str):
        turns = [turns]
    if not isinstance(turns, list) or not turns:
        raise ValueError("turns must be a non-empty list of user messages")
    for i, t in enumerate(turns):
        if not isinstance(t, str) or not t.strip():
            raise ValueError(f"turn {i + 1} is not a non-empty string")
    system = obj.get("system") or ""
    if not isinstance(system, str):
        raise ValueError("system must be a string")
    return Row(str(qid), cat.strip(), list(turns), system.strip())


def read_rows(lines: Iterable[str]) -> tuple[list[Row], list[Skipped]]:
    rows: list[Row] = []
    skipped: list[Skipped] = []
    seen: set[str] = set()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            skipped.append(Skipped(None, f"invalid JSON: {e.msg}", line=n))
            continue
        qid = obj.get("question_id") if isinstance(obj, dict) else None
        try:
            row = parse_row(obj)
        except ValueError as e:
            skipped.append(Skipped(None if qid is None else str(qid), str(e), line=n))
            continue
        if row.question_id in seen:
            skipped.append(Skipped(row.question_id, "duplicate question_id", line=n, category=row.category))
            continue
        seen.add(row.question_id)
        rows.append(row)
    return rows, skipped


def select_rows(rows: list[Row], categories: Iterable[str] | None = None, limit: int | None = None,
                per_category: int | None = None, turns: str = "all", round_robin: bool = False) -> list[Row]:
    """Filter by category (an unknown name is an error), keep the first `per_category` of each
    category, then the first `limit` rows; `turns="first"` keeps only each row's first turn.
    `round_robin` orders the rows category by category in turn (first of each, then second of
    each, ...), so a run stopped early still covers every category alike."""
    if turns not in ("all", "first"):
        raise ValueError("turns must be 'all' or 'first'")
    if categories:
        wanted = [c.strip() for c in categories if c.strip()]
        known = sorted({r.category for r in rows})
        unknown = [c for c in wanted if c not in known]
        if unknown:
            raise ValueError(f"unknown categories {unknown}; this file has: {', '.join(known)}")
        rows = [r for r in rows if r.category in wanted]
    if per_category is not None:
        count: dict[str, int] = {}
        kept = []
        for r in rows:
            if count.get(r.category, 0) < per_category:
                count[r.category] = count.get(r.category, 0) + 1
                kept.append(r)
        rows = kept
    if round_robin:
        by_cat: dict[str, list[Row]] = {}
        for r in rows:
            by_cat.setdefault(r.category, []).append(r)
        rows = [g[i] for i in range(max(map(len, by_cat.values()), default=0)) for g in by_cat.values() if i < len(g)]
    if limit is not None:
        rows = rows[: max(0, limit)]
    if turns == "first":
        rows = [Row(r.question_id, r.category, r.turns[:1], r.system) for r in rows]
    return rows


def load_rows(path: str | Path | None = None, categories: Iterable[str] | None = None, limit: int | None = None,
              per_category: int | None = None, turns: str = "all",
              round_robin: bool = False) -> tuple[list[Row], list[Skipped]]:
    """Rows to run and rows skipped (with reasons) from a JSONL file (default: the shipped prompts)."""
    path = Path(path) if path else DEFAULT_DATA
    with open(path, encoding="utf-8") as f:
        rows, skipped = read_rows(f)
    return select_rows(rows, categories, limit, per_category, turns, round_robin), skipped
