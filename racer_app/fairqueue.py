"""Gradio's queue with a fair share of the decode slot: at most one waiting or running decode
per browser session, its position for the page, and withdrawal of a waiting one (Stop).

Gradio (pinned, requirements.txt) keeps its waiting events in per-concurrency-group lists and
its running ones in `active_jobs`; this subclass reads those and refuses, at the moment a
request joins the queue, a decode from a session that already has one there. The refusal is a
validation error, so API clients get it as `ValidationError` with the message and the page
shows it next to the inputs. Everything here that touches Gradio's queue internals is in this
module (tests/test_reliability.py checks it against the installed Gradio).
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from gradio import route_utils
from gradio.queueing import Queue
from gradio.server_messages import ProcessCompletedMessage

#: The concurrency group whose events are decodes (app.py's "decode" group).
DECODE = "decode"


@dataclass(frozen=True)
class Place:
    """Where a session's decode stands: `position` 1-based among the `waiting` ones (None when
    it runs), `running` decodes in progress."""
    position: int | None
    waiting: int
    running: int
    api_name: str | None


def busy_message(api_name: str | None) -> str:
    what = {"race": "race", "chat": "chat turn", "benchmark": "benchmark"}.get(api_name or "", "request")
    return (f"This session already has a {what} waiting or running; one decode per visitor at a time. "
            f"Wait for it to finish, or press Stop, then try again.")


class FairQueue(Queue):
    """Installed by `install`; behaves as Gradio's queue for every group but the decode one."""

    guarded: tuple[str, ...] = (DECODE,)

    def _admission_lock(self) -> asyncio.Lock:
        # Made lazily: the lock must belong to the server's event loop.
        lock = self.__dict__.get("_racer_lock")
        if lock is None:
            lock = self.__dict__["_racer_lock"] = asyncio.Lock()
        return lock

    async def push(self, body: Any, request: Any, username: str | None) -> tuple:
        fn = None
        if body.fn_index is not None:
            try:
                fn = route_utils.get_fn(self.blocks, None, body)
            except Exception:  # noqa: BLE001 - let Gradio's own push report a bad index
                fn = None
        if fn is None or fn.concurrency_id not in self.guarded or not body.session_hash:
            return await super().push(body, request, username)
        # Check and enqueue under one lock: two joins from one session must not both pass.
        async with self._admission_lock():
            place = self.place(body.session_hash, fn.concurrency_id)
            if place is not None:
                refusal = {"__type__": "validate", "is_valid": False, "parameter_name": "session",
                           "message": busy_message(place.api_name)}
                return False, [refusal], "validator_error"
            return await super().push(body, request, username)

    # -- reading the queue ---------------------------------------------------------------------

    def _running(self, concurrency_id: str) -> list[Any]:
        return [ev for job in self.active_jobs if job for ev in job if ev.concurrency_id == concurrency_id]

    def load(self, concurrency_id: str = DECODE) -> tuple[int, int]:
        """(waiting, running) events of a group."""
        eq = self.event_queue_per_concurrency_id.get(concurrency_id)
        return (len(eq.queue) if eq is not None else 0), len(self._running(concurrency_id))

    def place(self, session_hash: str | None, concurrency_id: str = DECODE) -> Place | None:
        """This session's decode in the queue (waiting or running), or None."""
        if not session_hash:
            return None
        eq = self.event_queue_per_concurrency_id.get(concurrency_id)
        waiting = list(eq.queue) if eq is not None else []
        running = self._running(concurrency_id)
        for ev in running:
            if ev.session_hash == session_hash and ev.alive:
                return Place(None, len(waiting), len(running), ev.fn.api_name)
        for i, ev in enumerate(waiting):
            if ev.session_hash == session_hash:
                return Place(i + 1, len(waiting), len(running), ev.fn.api_name)
        return None

    async def withdraw(self, session_hash: str | None, concurrency_id: str = DECODE) -> int:
        """Take this session's waiting decodes out of the queue (as Gradio's /cancel does for a
        waiting event: removed, and its client told it completed). Returns how many."""
        if not session_hash:
            return 0
        eq = self.event_queue_per_concurrency_id.get(concurrency_id)
        if eq is None:
            return 0
        gone = []
        async with self.delete_lock:
            for ev in list(eq.queue):
                if ev.session_hash == session_hash:
                    eq.queue.remove(ev)
                    self.event_ids_to_events.pop(ev._id, None)
                    gone.append(ev)
        for ev in gone:
            # Completed with "no change" for every output: the page keeps what it shows (the
            # Stop handler writes the status) and an API client's result is a set of no-op updates.
            nothing = [{"__type__": "update"} for _ in ev.fn.outputs]
            self.send_message(ev, ProcessCompletedMessage(output={"data": nothing, "is_generating": False},
                                                          success=True))
        if gone and self.live_updates:
            self.broadcast_estimations(concurrency_id)
        return len(gone)


def install(blocks: Any) -> FairQueue:
    """Make `blocks`' queue (set by `blocks.queue()`) a FairQueue. Gradio builds its queue
    inside `Blocks.queue`; the subclass adds methods and no state, so switching the class of
    that object keeps everything Gradio set up."""
    q = blocks._queue
    if not isinstance(q, FairQueue):
        q.__class__ = FairQueue
    return q


def of(blocks: Any) -> FairQueue | None:
    q = getattr(blocks, "_queue", None)
    return q if isinstance(q, FairQueue) else None
