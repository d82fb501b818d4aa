"""Per-browser-session state: the last RACER trace, the chat (its drafter persists across
turns), and the stop switch. One `Session` per `gr.State`; nothing here is module-level, so
two users never see each other's text, drafts or pictures.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from racer.drafters.base import Drafter
from racer.records import StepRecord

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
    _spans: Any = field(default=None, repr=False)

    @property
    def n(self) -> int:
        return len(self.steps)

    @property
    def truncated(self) -> bool:
        return self.detail_steps < self.n

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
        for k in PICTURE_KEYS:
            s.info.pop(k, None)
    return min(len(steps), max_detail)


class Session:
    """Everything one browser session owns."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.trace: Trace | None = None
        self.race_summary: dict[str, Any] | None = None
        self.bench_summary: dict[str, Any] | None = None
        # Chat: its RACER drafter (automaton + copy-logit table) lives across turns.
        self.chat_drafter: Drafter | None = None
        self.chat_key: tuple | None = None          # settings the drafter was made with
        self.chat_sizer: Any = None                  # its tree sizer (capacity auto)
        self.chat_messages: list[dict[str, str]] = []
        self.chat_fed: list[int] = []                # tokens the chat drafter has seen
        self.chat_traces: int = 0
        self.busy = False
        self.created = time.time()

    # gr.State deep-copies initial values; a session is created fresh by its factory and
    # must stay one object (the Stop handler and a running decode share its event).
    def __deepcopy__(self, memo: dict) -> "Session":
        return self

    # ZeroGPU runs decodes in a worker process and pickles their arguments: the stop switch
    # (a lock) does not travel; the worker gets a fresh one (Stop then cancels the event).
    def __getstate__(self) -> dict:
        d = dict(self.__dict__)
        d.pop("stop", None)
        return d

    def __setstate__(self, d: dict) -> None:
        self.__dict__.update(d)
        self.stop = threading.Event()

    def reset_chat(self) -> None:
        self.chat_drafter = None
        self.chat_sizer = None
        self.chat_key = None
        self.chat_messages = []
        self.chat_fed = []

    def begin(self) -> threading.Event:
        """A fresh stop switch for a new request."""
        self.stop = threading.Event()
        return self.stop
