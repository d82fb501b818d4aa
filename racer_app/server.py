"""The Blocks the app is built on: Gradio's, with this server's bounds applied where Gradio
takes them (queue length, sessions kept, upload size, cached files' age) plus what Gradio
lacks (a request-body limit before parsing, one decode per session in the queue, a plain
message for an API call with too few values).

`StudioBlocks(limits)` is used like `gr.Blocks`; its `launch` fills in the bounded options
unless the caller passes them.
"""
from __future__ import annotations

from typing import Any

import gradio as gr
from starlette.middleware import Middleware

from . import fairqueue
from .bodylimit import BodyLimit
from .settings import Limits


def _input_name(block: Any) -> str:
    label = getattr(block, "label", None)
    if isinstance(label, str) and label.strip():
        return label.strip()
    eid = getattr(block, "elem_id", None)
    return str(eid) if eid else block.get_block_name()


class StudioBlocks(gr.Blocks):
    def __init__(self, limits: Limits, **kw: Any) -> None:
        # Gradio copies every file a handler returns into its cache; age those copies out on
        # the same schedule as the benchmark folders they come from.
        age = max(60, int(limits.files_max_age_s))
        kw.setdefault("delete_cache", (max(30, min(600, age // 4)), age))
        self.racer_limits = limits          # before Blocks.__init__, which calls self.queue()
        super().__init__(**kw)

    def queue(self, *a: Any, **kw: Any) -> "StudioBlocks":
        kw.setdefault("max_size", self.racer_limits.queue_size)
        super().queue(*a, **kw)
        fairqueue.install(self)
        return self

    # -- per-session state Gradio holds (StateHolder, keyed by the session hash) ---------------

    def session_value(self, session_hash: str, component: Any) -> Any:
        """The value of a gr.State in one session, without touching its place in Gradio's
        least-recently-used order (a closed session must not look fresh)."""
        st = self.state_holder.session_data.get(session_hash)
        return None if st is None else st.state_data.get(component._id)

    def forget_session(self, session_hash: str) -> None:
        """Drop one session's state now: Gradio would keep a closed tab's state for an hour."""
        holder = self.state_holder
        with holder.lock:
            holder.session_data.pop(session_hash, None)
            holder.time_last_used.pop(session_hash, None)

    def validate_inputs(self, block_fn: Any, inputs: list[Any]) -> None:
        # Gradio's own message lists the inputs as Python object reprs.
        if len(inputs) >= len(block_fn.inputs):
            return
        names = [_input_name(b) for b in block_fn.inputs if not getattr(b, "skip_api", False)]
        endpoint = f"/{block_fn.api_name}" if block_fn.api_name else "this event"
        raise gr.Error(f"{endpoint} takes {len(names)} values, in this order: {', '.join(names)}; fewer were "
                       f"sent. The page's 'Use via API' link shows each one with its type.", print_exception=False)

    def launch(self, *a: Any, **kw: Any) -> Any:
        lim = self.racer_limits
        max_body = int(lim.max_body_mb * 2**20)
        kw.setdefault("state_session_capacity", lim.max_sessions)
        kw.setdefault("max_file_size", max_body)
        app_kwargs = dict(kw.pop("app_kwargs", None) or {})
        app_kwargs["middleware"] = list(app_kwargs.get("middleware") or []) + [Middleware(BodyLimit, max_bytes=max_body)]
        kw["app_kwargs"] = app_kwargs
        return super().launch(*a, **kw)
