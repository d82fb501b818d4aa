"""Per-browser-session state: the last RACER trace, the chat (its drafter persists across
turns), the decode job it has asked for (with its stop switch) and its memory bound. One
`Session` per `gr.State`; nothing here is module-level, so two users never see each other's
text, drafts or pictures.
"""
from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from racer.coldrows import load as load_cold_rows
from racer.drafters import make_drafter
from racer.drafters.base import Drafter
from racer.records import StepRecord
from racer.replay import Replay, Turn
from racer.sizing import Sizer

from .jobs import QUEUED, Job
from .memsize import deep_size

#: Per-step info keys that hold picture data (dropped beyond the inspector's step limit).
PICTURE_KEYS = ("automaton", "copy_rows")


@dataclass
class Trace:
    """A recorded RACER run the inspector steps through (never re-running the model)."""
    steps: list[StepRecord]
    prompt_ids: list[int]
    decode_one: Callable[[int], str]
    decode_many: Callable[[list[int]], str]
    source: str = "race"                 # "race", "chat" or "preset"
    title: str = ""
    model: str = ""
    settings: dict[str, Any] = field(default_factory=dict)
    detail_steps: int = 0                # steps that kept picture data
    stop_reason: str | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    #: The hardware cost curve the run was sized with (racer.costcurve.CostCurve), if any.
    cost_curve: Any = None
    #: What replays the run without the model (racer.replay): every decode of the drafter's
    #: life (a chat's earlier turns too; `steps` are the last one's), the drafter it was made
    #: with ({"method", "options", "vocab_size"}) and the sizer's settings (None: fixed capacity).
    turns: list[Turn] | None = None
    drafter: dict[str, Any] | None = None
    sizer: dict[str, Any] | None = None
    #: Where the trace came from when it was not recorded in this server ("file", "shipped").
    origin: str = ""
    #: The model's cold rows the run drafted with (racer.coldrows.ColdRows; `drafter["cold_rows"]`
    #: holds their key, so a trace read from a file finds them in this machine's cache).
    cold_rows: Any = None
    _spans: Any = field(default=None, repr=False)

    @property
    def n(self) -> int:
        return len(self.steps)

    @property
    def truncated(self) -> bool:
        return self.detail_steps < self.n

    @property
    def greedy(self) -> bool:
        return float(self.settings.get("temperature", 0.0) or 0.0) <= 0.0

    def replay(self) -> Replay | None:
        """A replay of this run (None when it was not recorded with its replay data)."""
        if not self.turns or self.drafter is None:
            return None
        d = self.drafter
        cold = None
        if any(t.start.cold_rows for t in self.turns):
            cold = self.cold_rows
            if cold is None and d.get("cold_rows"):
                cold = load_cold_rows(d["cold_rows"])
            if cold is None:
                return None  # drafted with cold rows this machine does not have: it would not replay
        make = lambda: make_drafter(d["method"], vocab_size=int(d.get("vocab_size") or 1),  # noqa: E731
                                    **dict(d.get("options") or {}))
        sizer = None
        if self.sizer is not None:
            if self.cost_curve is None:
                return None
            curve, cfg = self.cost_curve, dict(self.sizer)
            sizer = lambda: Sizer(curve, **cfg)  # noqa: E731
        return Replay(self.turns, make, sizer, cold)

    def spans(self) -> tuple[list[tuple[str, str | None]], list[int]]:
        """Coloured spans of the generated text and the step of each span (computed once)."""
        if self._spans is None:
            from visuals import text_spans
            self._spans = text_spans(self.steps, self.decode_one, decode_many=self.decode_many)
        return self._spans


def bound_detail(steps: list[StepRecord], max_detail: int) -> int:
    """Drop picture data from steps beyond `max_detail` (keeps memory per session bounded).
    Returns how many steps keep it."""
    for s in steps[max_detail:]:
        # The drafter's tree carries the same pictures in its own info dict (the loop copies
        # them into the step's): both references must go for the memory to be freed.
        tree_info = getattr(getattr(s, "tree", None), "info", None)
        for k in PICTURE_KEYS:
            s.info.pop(k, None)
            if isinstance(tree_info, dict):
                tree_info.pop(k, None)
    return min(len(steps), max_detail)


class Session:
    """Everything one browser session owns."""

    def __init__(self) -> None:
        # A name for this session's files (racer_app.workspace); never shown, never from a visitor.
        self.id = uuid.uuid4().hex
        self.job: Job | None = None                  # the decode asked for: queued, running or None
        self.trace: Trace | None = None
        self.race_summary: dict[str, Any] | None = None
        self.bench_summary: dict[str, Any] | None = None
        self.bench_files: list[str] = []             # the latest benchmark's report files
        # Chat: its RACER drafter (automaton + copy-logit table) lives across turns.
        self.chat_drafter: Drafter | None = None
        self.chat_key: tuple | None = None          # settings the drafter was made with
        self.chat_sizer: Any = None                  # its tree sizer (capacity auto)
        self.chat_messages: list[dict[str, str]] = []
        self.chat_fed: list[int] = []                # tokens the chat drafter has seen
        self.chat_turns_log: list[Turn] = []         # every decode of the chat drafter (to replay it)
        #: The inspector's last anatomy: (trace id, step, data), so moving between stages
        #: does not replay the run again.
        self.anatomy: tuple[int, int, Any] | None = None
        self.chat_traces: int = 0
        self.created = time.time()
        self.closed = False

    # gr.State deep-copies initial values; a session is created fresh by its factory and
    # must stay one object (the Stop handler and a running decode share its job).
    def __deepcopy__(self, memo: dict) -> "Session":
        return self

    # ZeroGPU runs decodes in a worker process and pickles their arguments: the job (its
    # events) does not travel; the worker makes its own (Stop then cancels the event).
    def __getstate__(self) -> dict:
        d = dict(self.__dict__)
        d["job"] = None
        return d

    def __setstate__(self, d: dict) -> None:
        self.__dict__.update(d)

    @property
    def busy(self) -> bool:
        return self.job is not None and self.job.live

    @property
    def stop(self) -> threading.Event:
        """The stop switch of the current job (a spare one when there is none)."""
        return self.job.stop if self.job is not None else threading.Event()

    def reset_chat(self) -> None:
        self.chat_drafter = None
        self.chat_sizer = None
        self.chat_key = None
        self.chat_messages = []
        self.chat_fed = []
        self.chat_turns_log = []

    # -- jobs ------------------------------------------------------------------------------

    def admit(self, kind: str) -> Job:
        """A queued job for the decode this session is about to ask for (replacing a job that
        never reached the queue)."""
        self.job = Job(kind)
        return self.job

    def begin(self, kind: str) -> Job:
        """The decode starts: it takes the job queued for it, with any Stop already pressed,
        or a new one (an API call, which had no page to queue a job)."""
        job = self.job
        if job is None or job.state != QUEUED or job.kind != kind:
            job = self.job = Job(kind)
        job.start()
        return job

    def end(self, job: Job) -> None:
        job.finish()

    # -- memory ------------------------------------------------------------------------------

    def _own_data(self) -> list[Any]:
        return [self.trace, self.race_summary, self.bench_summary, self.bench_files, self.chat_drafter,
                self.chat_sizer, self.chat_messages, self.chat_fed, self.chat_turns_log, self.anatomy]

    def size_bytes(self) -> int:
        """Memory this session alone keeps (the model, tokenizer and cost curve are shared)."""
        return deep_size(self._own_data())

    def fit(self, max_bytes: int) -> list[str]:
        """Keep this session within `max_bytes`: drop the trace's pictures from later steps
        first, then the chat's automaton, then the trace. Returns notes on what went."""
        notes: list[str] = []
        size = self.size_bytes()
        tr = self.trace
        while size > max_bytes and tr is not None and tr.detail_steps > 0:
            tr.detail_steps = bound_detail(tr.steps, tr.detail_steps // 2)
            size = self.size_bytes()
            if size <= max_bytes:
                notes.append(f"pictures kept for the first {tr.detail_steps} steps only (this server's memory "
                             f"limit per visitor)")
        if size > max_bytes and self.chat_drafter is not None:
            self.reset_chat()
            notes.append("the chat's automaton was dropped (this server's memory limit per visitor); the next "
                         "message starts a fresh one")
            size = self.size_bytes()
        if size > max_bytes and tr is not None and tr.turns:
            tr.turns = None
            self.anatomy = None
            notes.append("the run's replay data was dropped (this server's memory limit per visitor): the anatomy "
                         "and what-if views are off for it")
            size = self.size_bytes()
        if size > max_bytes and self.trace is not None:
            self.trace = None
            notes.append("the run was not kept for the inspector (this server's memory limit per visitor)")
        return notes

    def release(self) -> None:
        """The session has ended: stop what it runs and let go of its data."""
        self.closed = True
        if self.job is not None and self.job.live:
            self.job.stop.set()
        self.trace = None
        self.anatomy = None
        self.race_summary = self.bench_summary = None
        self.bench_files = []
        self.reset_chat()
