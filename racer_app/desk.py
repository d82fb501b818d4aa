"""The front desk of the decode slot: it admits a session's decode request, shows where it
waits, stops it (queued or running) and tidies up when a session ends.

The page asks here first (`admitter(kind)`, a light handler) and only then sends the decode
itself, so the request's job, and with it its stop switch, exists while it waits; API calls go
straight to the decode and meet the same rule in the queue (racer_app.fairqueue).
"""
from __future__ import annotations

import asyncio
import logging
import time
import weakref
from pathlib import Path
from typing import Any, Callable

import gradio as gr

from . import fairqueue
from .jobs import KIND_NAMES, QUEUED, RUNNING
from .memtrim import Trimmer
from .session import Session
from .settings import Limits
from .workspace import Workspace

log = logging.getLogger("racer_app")

#: Views whose decodes the desk admits, in the order of `queue_tick`'s outputs.
KINDS = ("race", "chat", "benchmark")
#: How long after admission the page's decode may take to reach the queue (a round trip; the
#: queue timer stops after this if it never arrives, e.g. when the queue was full).
SEND_GRACE_S = 30.0
#: How long Stop waits for an admitted decode that has not reached the queue yet (the page sends it
#: right after admission, within a round trip), so that it takes it out of the queue rather than
#: leave it to wait its turn only to end at once, holding the session's place meanwhile.
JOIN_WAIT_S = 1.0
#: The decode endpoints' API names (app.py) and the view each belongs to.
API_KINDS = {"race": "race", "chat": "chat", "benchmark": "benchmark"}


def queue_md(place: fairqueue.Place | None, name: str) -> str:
    """The waiting line under a view's buttons."""
    if place is None or place.position is None:
        return ""
    ahead = place.position - 1 + place.running
    return (f"⏳ Your {name} is number **{place.position}** in the queue ({ahead} request"
            f"{'' if ahead == 1 else 's'} ahead of it, one decode at a time per slot). **Stop** takes it out.")


class Desk:
    def __init__(self, limits: Limits, workspace: Workspace | None = None) -> None:
        self.limits = limits
        self.workspace = workspace or Workspace(max_age_s=limits.files_max_age_s,
                                                max_bytes=int(limits.files_max_mb * 2**20))
        self.blocks: Any = None
        self.state: Any = None            # the gr.State holding each Session
        self.ended = 0                    # sessions tidied up (tests wait on this)
        self.trim = Trimmer()
        self._watched: set[str] = set()  # session ids whose folder has a finalizer

    def attach(self, blocks: Any, state: Any) -> None:
        """Called by app.py once the layout exists: the queue and the session state to read."""
        self.blocks, self.state = blocks, state
        self.workspace.start(every_s=max(10.0, min(300.0, self.limits.files_max_age_s / 6)))

    @property
    def queue(self) -> fairqueue.FairQueue | None:
        return fairqueue.of(self.blocks) if self.blocks is not None else None

    def place(self, request: Any) -> fairqueue.Place | None:
        q = self.queue
        return q.place(getattr(request, "session_hash", None)) if q is not None else None

    # -- admission (the page's light step before a decode) -------------------------------------

    def admitter(self, kind: str) -> Callable[..., tuple]:
        """The handler the page runs when a decode button is pressed. Outputs: status, the
        view's go button, its Stop button, its queue line, the queue timer."""
        def admit(sess: Session, request: gr.Request) -> tuple:
            return self.admit(kind, sess, request)
        admit.__name__ = f"admit_{kind}"
        return admit

    def admit(self, kind: str, sess: Any, request: Any = None) -> tuple:
        if not isinstance(sess, Session):
            return (gr.skip(),) * 5
        place = self.place(request)
        job = sess.job
        if place is not None or (job is not None and job.state == RUNNING):
            what = job.name if job is not None and job.live else "request"
            # Raising keeps the chained decode from being sent; the page shows the message.
            raise gr.Error(f"This session already has a {what} waiting or running; one decode per visitor at a "
                           f"time. Wait for it to finish, or press Stop, then try again.", title="One at a time",
                           print_exception=False)
        job = sess.admit(kind)
        q = self.queue
        waiting, running = q.load() if q is not None else (0, 0)
        ahead = waiting + running
        line = (f"⏳ Waiting for the decode slot: {ahead} request{'' if ahead == 1 else 's'} ahead. **Stop** takes "
                f"it out of the queue.") if ahead else ""
        return (f"⏳ Your {job.name} is in the queue…", gr.Button(interactive=False), gr.Button(interactive=True),
                line, gr.Timer(active=True))

    # -- queue position (a light timer while a job waits) --------------------------------------

    def queue_tick(self, sess: Session, request: gr.Request) -> tuple:
        """Outputs: the queue lines of the race, chat and benchmark views, the timer (it stops
        once the decode runs or is gone)."""
        place = self.place(request)
        if place is None or place.position is None:
            job = sess.job if isinstance(sess, Session) else None
            if (place is None and job is not None and job.state == QUEUED and not job.stop.is_set()
                    and time.monotonic() - job.created < SEND_GRACE_S):
                return (gr.skip(),) * 4       # the page has not sent the decode yet
            return "", "", "", gr.Timer(active=False)
        kind = API_KINDS.get(place.api_name or "", "race")
        line = queue_md(place, KIND_NAMES.get(kind, kind))
        return tuple(line if k == kind else "" for k in KINDS) + (gr.skip(),)

    # -- stop -------------------------------------------------------------------------------------

    async def stop(self, sess: Session, request: gr.Request) -> tuple:
        """Stop this session's decode: a waiting one leaves the queue now (it never runs), a
        running one ends at its next step. Outputs: status, go button, Stop button."""
        idle = (gr.Button(interactive=True), gr.Button(interactive=False))
        job = sess.job if isinstance(sess, Session) else None
        place = self.place(request)
        if job is not None and job.state == QUEUED:
            job.stop.set()        # seen by the decode if it starts before it can be taken out
            if place is None:
                place = await self._joined(request)
        if place is not None and place.position is not None:
            q = self.queue
            if q is not None and await q.withdraw(getattr(request, "session_hash", None)) and \
                    job is not None and job.state == QUEUED:
                job.finish()
            name = job.name if job is not None and job.live else KIND_NAMES.get(place.api_name or "", "request")
            return (f"⏹ Stopped: your {name} was taken out of the queue before it started.",) + idle
        if job is None or not job.live:
            return ("Nothing is running or waiting in this session.",) + idle
        if job.state == QUEUED:   # admitted by the page, not in the queue yet: it will end at once
            return (f"⏹ Stopped: your {job.name} will not start.",) + idle
        job.stop.set()
        return (f"⏹ Stopping the {job.name} at the next step…", gr.skip(), gr.skip())

    async def _joined(self, request: Any) -> fairqueue.Place | None:
        """This session's decode once it reaches the queue, waiting up to `JOIN_WAIT_S`; None if
        it does not (an API client's request, a full queue)."""
        if self.queue is None or not getattr(request, "session_hash", None):
            return None
        end = time.monotonic() + JOIN_WAIT_S
        while time.monotonic() < end:
            await asyncio.sleep(0.05)
            place = self.place(request)
            if place is not None:
                return place
        return None

    def run_folder(self, sess: Session) -> Path:
        """A fresh folder for this session's next benchmark run. The session's files go when it
        ends; also if Gradio drops its state without a callback (its session cap evicts
        silently), when the Session object itself is collected."""
        if sess.id not in self._watched:
            weakref.finalize(sess, self.workspace.remove_session, sess.id)
            self._watched.add(sess.id)
        return self.workspace.new_run(sess.id)

    def decode_ended(self) -> None:
        """After every decode (its KV caches and drafts are garbage now)."""
        self.trim.request()

    # -- the end of a session --------------------------------------------------------------------

    def end_session(self, sess: Any) -> None:
        """Free what a session holds: its job is stopped, its data and benchmark files go."""
        if not isinstance(sess, Session) or sess.closed:
            return
        sess.release()
        self.workspace.remove_session(sess.id)
        self.ended += 1
        self.trim.request()

    def session_expired(self, sess: Any) -> None:
        """gr.State's delete_callback: the state outlived its time to live (or was dropped)."""
        try:
            self.end_session(sess)
        except Exception:  # noqa: BLE001 - Gradio's expiry loop must keep going
            log.exception("ending an expired session failed")

    def session_closed(self, request: gr.Request) -> None:
        """demo.unload: the tab was closed or reloaded (its heartbeat dropped)."""
        blocks, state = self.blocks, self.state
        h = getattr(request, "session_hash", None)
        if blocks is None or state is None or not h:
            return
        sess = blocks.session_value(h, state)
        if sess is not None:
            self.end_session(sess)
        # Even when its state already expired: Gradio keeps the session's page state too.
        blocks.forget_session(h)
