"""The benchmark loop: warm-up, then every question's turns with the methods interleaved.

Order for each question and turn: repeat 1: A B C, repeat 2: A B C, ... (so slow drifts of
the machine, such as heat or a neighbour's load, hit every method alike). Each repeat replays
the conversation in its own Conversation, so no drafter ever sees a turn twice. Multi-turn rows:
each method's next turn is built from ITS OWN earlier answers (the conversation it would
really have); under greedy decoding every lossless method gives the same answers anyway, and
the summary marks turns whose prompt differs from ar's.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence, TextIO

from ..coldrows import get_cold_rows
from ..loop import DecodeConfig
from ..models import LoadedModel
from ..prompting import build_input_ids
from ..records import mean_accepted
from .data import Row, Skipped
from .methods import BenchMethod, Outcome, get_method
from .progress import Progress

Encoder = Callable[[list[dict[str, str]]], list[int]]


def parse_capacity(text: str | None) -> int | str | None:
    """A --capacity argument: None (the library's default), "auto", or a whole number >= 1."""
    if text is None:
        return None
    if text.strip().lower() == "auto":
        return "auto"
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"--capacity must be 'auto' or a whole number, not {text!r}") from None
    if value < 1:
        raise ValueError("--capacity must be at least 1")
    return value


@dataclass
class BenchSettings:
    max_new_tokens: int = 256
    #: Draft tree size incl. the root, "auto", or None for DecodeConfig's default.
    capacity: int | str | None = None
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    repeats: int = 1
    #: Untimed warm-up passes over every method before the clock starts.
    warmup: int = 1
    warmup_tokens: int = 32

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def config(self, seed: int | None = None, max_new_tokens: int | None = None) -> DecodeConfig:
        kw: dict[str, Any] = dict(max_new_tokens=int(max_new_tokens or self.max_new_tokens),
                                  temperature=float(self.temperature), top_p=float(self.top_p), top_k=int(self.top_k),
                                  seed=self.seed if seed is None else seed)
        if self.capacity is not None:
            kw["capacity"] = self.capacity
        return DecodeConfig(**kw)

    def resolved_capacity(self) -> int | str:
        return self.config().capacity


@dataclass
class RunRecord:
    """Everything the summary needs that results.jsonl does not keep."""
    #: (question_id, turn) -> ar's prompt ids (for the top-2 margin at a first difference).
    ref_prompts: dict[tuple[str, int], list[int]] = field(default_factory=dict)
    #: (question_id, turn, method) -> whether the method's prompt equals ar's.
    same_prompt: dict[tuple[str, int, str], bool] = field(default_factory=dict)


@dataclass
class BenchRun:
    results: list[dict[str, Any]]
    skipped: list[Skipped]
    errors: list[dict[str, Any]]
    interrupted: bool
    record: RunRecord
    methods: list[str]
    settings: BenchSettings
    runs_done: int = 0
    runs_planned: int = 0
    elapsed_s: float = 0.0


def seed_for(question_id: str, turn: int, base: int) -> int:
    """The same seed for every method on a given question and turn, different across them, and
    independent of which other rows were selected."""
    return int(base) + (zlib.crc32(str(question_id).encode()) % 1_000_000) * 16 + turn


def _round_list(xs: Iterable[float], nd: int = 3) -> list[float]:
    return [round(float(x), nd) for x in xs]


def outcome_row(row: Row, turn: int, method: str, outs: list[tuple[int, Outcome]], text: str,
                prompt_len: int) -> dict[str, Any]:
    """One results.jsonl row: the first repeat's tokens and trace; wall time = median over repeats."""
    seqs = [s for s, _ in outs]
    o = outs[0][1]
    walls = [x.wall_s for _, x in outs]
    wall = statistics.median(walls)
    n = len(o.token_ids)
    same = all(x.token_ids == o.token_ids for _, x in outs[1:])
    return {
        "question_id": row.question_id, "category": row.category, "method": method, "turn": turn,
        "prompt_len": prompt_len, "new_tokens": n, "steps": o.steps, "forwards": o.forwards,
        "mat": round(mean_accepted(n, o.forwards), 4) if o.forwards else None,
        "wall_s": round(wall, 6), "tokens_per_s": round(n / wall, 3) if wall > 0 else None,
        "prefill_ms": None if o.prefill_ms is None else round(o.prefill_ms, 3),
        "stop_reason": o.stop_reason,
        "accept_lengths": o.accept_lengths,
        "token_ids": o.token_ids,
        "text": text,
        "timings": {k: round(v, 3) for k, v in o.timings.items()},
        "step_ms": None if o.step_ms is None else {k: _round_list(v) for k, v in o.step_ms.items()},
        "elapsed_ms": _round_list(o.elapsed_ms, 2),
        "tree_sizes": o.tree_sizes,
        "repeats_wall_s": [round(w, 6) for w in walls],
        "repeats_prefill_ms": [None if x.prefill_ms is None else round(x.prefill_ms, 3) for _, x in outs],
        "repeats_identical": same,
        "seq": seqs,
    }


def run_rows(lm: LoadedModel, rows: Sequence[Row], methods: Sequence[str | BenchMethod],
                  settings: BenchSettings | None = None, *, encode: Encoder | None = None,
                  skipped: list[Skipped] | None = None, results_file: TextIO | None = None,
                  progress: bool = True, log: TextIO | None = None,
                  on_result: Callable[[dict[str, Any]], None] | None = None) -> BenchRun:
    """Run every row's turns with every method, interleaved; returns what finished.

    `encode(messages) -> ids` builds a prompt (default: the model's chat template via
    `build_input_ids`). `results_file` gets each results row as soon as it is complete, so a
    Ctrl-C keeps what finished; KeyboardInterrupt is caught and reported as `interrupted`.
    """
    st = settings or BenchSettings()
    log = log or sys.stderr
    ms = [get_method(m) for m in methods]
    names = [m.name for m in ms]
    if len(set(names)) != len(names):
        raise ValueError(f"methods named twice: {names}")
    if not ms:
        raise ValueError("no methods to run")
    if st.repeats < 1:
        raise ValueError("repeats must be at least 1")
    encode = encode or (lambda msgs: build_input_ids(lm.tokenizer, msgs))
    limit_ctx = lm.max_context - st.max_new_tokens
    if limit_ctx < 1:
        raise ValueError(f"max_new_tokens {st.max_new_tokens} leaves no room for a prompt in this model's "
                         f"context of {lm.max_context} tokens")
    skipped = list(skipped or [])
    errors: list[dict[str, Any]] = []
    record = RunRecord()

    # Turn 1 prompts are known now: skip what cannot fit before anything runs.
    plan: list[tuple[Row, list[int]]] = []
    for row in rows:
        try:
            ids = list(encode(row.messages([], row.turns[0])))
        except Exception as e:  # noqa: BLE001 - a row that cannot be encoded is reported, not fatal
            skipped.append(Skipped(row.question_id, f"could not build the prompt: {e}", category=row.category))
            continue
        if not ids:
            skipped.append(Skipped(row.question_id, "empty prompt", category=row.category))
        elif len(ids) > limit_ctx:
            skipped.append(Skipped(row.question_id, f"prompt of {len(ids)} tokens > context {lm.max_context} - "
                                   f"max_new_tokens {st.max_new_tokens}", turn=1, category=row.category,
                                   extra={"prompt_len": len(ids)}))
        else:
            plan.append((row, ids))
    for s in skipped:
        log.write(f"skipped {s.question_id or '(line %s)' % s.line}: {s.reason}\n")

    total = sum(len(r.turns) for r, _ in plan) * len(ms) * st.repeats
    out = BenchRun([], skipped, errors, False, record, names, st, 0, total)
    if not plan:
        return out

    # The model's cold rows are made once per machine, like its cost curve, and never timed.
    # A model they cannot be made for (an architecture whose cache will not batch) runs without them.
    if any(m.wants_cold_rows(lm) for m in ms) and lm.cold_rows is None:
        t = time.perf_counter()
        try:
            get_cold_rows(lm)
            if progress:
                log.write(f"cold rows ready ({time.perf_counter() - t:.1f} s; made once per machine)\n")
        except Exception as e:  # noqa: BLE001
            log.write(f"cold rows could not be made ({e.__class__.__name__}: {e}); racer runs without them\n")
    # Warm-up: every method, untimed, on the first prompt (kernels, allocator, cost curve for "auto").
    if st.warmup:
        ids = plan[0][1]
        for _ in range(st.warmup):
            for i, m in enumerate(ms):
                if progress:
                    first_auto = i == 0 and st.resolved_capacity() == "auto"
                    log.write(f"warm-up (untimed): {m.name}" +
                              (" (the first 'auto' run on a machine measures its cost curve)" if first_auto else "") + "\n")
                    log.flush()
                try:
                    m.conversation(lm).run(ids, st.config(seed=st.seed, max_new_tokens=min(st.warmup_tokens,
                                                                                       st.max_new_tokens)))
                except KeyboardInterrupt:
                    out.interrupted = True
                    return out
                except Exception as e:
                    raise RuntimeError(f"method {m.name} failed during the warm-up: {e.__class__.__name__}: {e}") from e

    bar = Progress(total, stream=log, enabled=progress)
    t_start = time.perf_counter()
    done = 0
    seq = 0
    bar.update(0, "starting")
    try:
        for row, ids1 in plan:
            conversations = {m.name: [m.conversation(lm) for _ in range(st.repeats)] for m in ms}
            history: dict[str, list[dict[str, str]]] = {m.name: [] for m in ms}
            alive = list(ms)
            for turn, user in enumerate(row.turns, 1):
                msg = {"role": "user", "content": user}
                prompts: dict[str, list[int]] = {}
                for m in alive:
                    prompts[m.name] = ids1 if turn == 1 else list(encode(row.messages(history[m.name], user)))
                long = {k: len(v) for k, v in prompts.items() if len(v) > limit_ctx}
                if long:
                    # Every method skips this turn (and the rest of the conversation): same questions for all.
                    skipped.append(Skipped(row.question_id, f"turn {turn}: prompt of {max(long.values())} tokens > "
                                           f"context {lm.max_context} - max_new_tokens {st.max_new_tokens}",
                                           turn=turn, category=row.category, extra={"prompt_lens": long}))
                    bar.message(f"skipped {row.question_id} from turn {turn}: prompt too long ({long})")
                    done += (len(row.turns) - turn + 1) * len(alive) * st.repeats
                    bar.update(done)
                    break
                if "ar" in prompts:
                    record.ref_prompts[(row.question_id, turn)] = prompts["ar"]
                    for k, v in prompts.items():
                        record.same_prompt[(row.question_id, turn, k)] = v == prompts["ar"]
                outs: dict[str, list[tuple[int, Outcome]]] = {m.name: [] for m in alive}
                failed: set[str] = set()
                try:
                    for r in range(st.repeats):
                        for m in alive:
                            if m.name in failed:
                                done += 1
                                continue
                            cfg = st.config(seed=seed_for(row.question_id, turn, st.seed))
                            try:
                                o = conversations[m.name][r].run(prompts[m.name], cfg)
                            except KeyboardInterrupt:
                                raise
                            except Exception as e:  # noqa: BLE001 - one failed run is reported, the rest go on
                                failed.add(m.name)
                                err = {"question_id": row.question_id, "turn": turn, "method": m.name,
                                       "error": f"{e.__class__.__name__}: {e}"}
                                errors.append(err)
                                bar.message(f"error: {m.name} on {row.question_id} turn {turn}: {err['error']}")
                            else:
                                outs[m.name].append((seq, o))
                            seq += 1
                            done += 1
                            bar.update(done, f"{row.question_id} t{turn} {m.name}")
                finally:
                    # Emit what completed every repeat (on Ctrl-C too).
                    for m in alive:
                        got = outs[m.name]
                        if m.name in failed or len(got) < st.repeats:
                            continue
                        text = lm.tokenizer.decode(got[0][1].token_ids, skip_special_tokens=True)
                        res = outcome_row(row, turn, m.name, got, text, len(prompts[m.name]))
                        out.results.append(res)
                        if results_file is not None:
                            results_file.write(json.dumps(res, ensure_ascii=False) + "\n")
                            results_file.flush()
                        if on_result is not None:
                            on_result(res)
                        history[m.name] = history[m.name] + [msg, {"role": "assistant", "content": text}]
                if failed:
                    # A failed turn ends that method's conversation; the others go on.
                    rest = len(row.turns) - turn
                    done += rest * len(failed) * st.repeats
                    alive = [m for m in alive if m.name not in failed]
                    bar.update(done)
                if not alive:
                    break
    except KeyboardInterrupt:
        out.interrupted = True
        bar.message("interrupted: keeping what finished")
    finally:
        bar.close()
    out.runs_done = done
    out.elapsed_s = time.perf_counter() - t_start
    return out
