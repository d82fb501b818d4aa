"""A session's decode request (race, chat turn or benchmark) from the moment it is asked for.

A `Job` exists before its decode runs: the page makes it when the request joins the queue, so
Stop can reach a request that is still waiting (its stop switch is already there when the
decode starts and sees it). A session has at most one live job (`Session.job`); the queue
(racer_app.fairqueue) refuses a second decode from the same session.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

#: What each kind of job is called in messages.
KIND_NAMES = {"race": "race", "chat": "chat turn", "benchmark": "benchmark"}

QUEUED, RUNNING, DONE = "queued", "running", "done"


@dataclass(eq=False)
class Job:
    kind: str
    stop: threading.Event = field(default_factory=threading.Event)
    state: str = QUEUED
    created: float = field(default_factory=time.monotonic)
    #: Set once the job is over (finished, stopped, failed or withdrawn from the queue).
    ended: threading.Event = field(default_factory=threading.Event)

    @property
    def name(self) -> str:
        return KIND_NAMES.get(self.kind, self.kind)

    @property
    def live(self) -> bool:
        return self.state != DONE

    def start(self) -> None:
        self.state = RUNNING

    def finish(self) -> None:
        self.state = DONE
        self.ended.set()
