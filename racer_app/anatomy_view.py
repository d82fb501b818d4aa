"""The inspector's anatomy of a step and its "what if" answers, computed from a session's trace.

Each call replays the trace up to the step (racer.replay, about a millisecond or two a step,
no model). The last step's result is kept in the session, so moving between the stages of one
step does not replay again; nothing else is kept between calls.
"""
from __future__ import annotations

import logging
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from racer import anatomy as A
from racer.replay import ReplayError

from .session import Session, Trace

log = logging.getLogger("racer_app")

#: The what-if table: the run's own draft, each source switched off, other sizes, the other rule.
TABLE_VARIANTS = (
    A.Variant(),
    A.Variant(retrieval=False),
    A.Variant(logits=False),
    A.Variant(lookup=False),
    A.Variant(capacity=8),
    A.Variant(capacity=16),
    A.Variant(capacity=64),
    A.Variant(breadth_rule="released"),     # read as "the other breadth rule" (_own_variant)
)


@dataclass
class StepAnatomy:
    """Everything the anatomy and what-if views show for one step."""
    k: int
    data: dict[str, Any] | None = None        # racer.anatomy.anatomy(...)
    why: dict[str, Any] | None = None         # racer.anatomy.why_missed(...)
    table: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""                           # why there is no anatomy (plain words)
    replay_ms: float = 0.0


def unavailable(trace: Trace | None) -> str:
    """Why a trace has no anatomy (empty when it has one)."""
    if trace is None:
        return "No run to look into yet: run a race or chat, or load a trace."
    if trace.drafter is None or trace.drafter.get("method") != "racer":
        return "The anatomy explains RACER steps; this trace is not one."
    if not trace.turns:
        return ("This run was kept without its replay data (the server's memory limit per visitor, or a trace "
                "file without it), so its steps cannot be taken apart.")
    if trace.sizer is not None and trace.cost_curve is None:
        return "This run was sized automatically but its cost curve was not kept, so its sizing cannot be replayed."
    return ""


def _own_variant(trace: Trace, v: A.Variant) -> A.Variant:
    """Table variants are relative to the run: a source the run did not use stays off."""
    d = (trace.drafter or {}).get("options") or {}
    rule = str(d.get("breadth_rule", "paper"))
    if v.breadth_rule != "paper":
        rule = "released" if rule == "paper" else "paper"
    return A.Variant(v.retrieval and d.get("retrieval", True), v.logits and d.get("logits", True),
                     v.lookup and d.get("lookup_chain", True), v.capacity, rule)


def step_anatomy(sess: Session | None, trace: Trace | None, k: int) -> StepAnatomy:
    """The anatomy of step `k` of `trace` (cached in `sess` for the same trace and step)."""
    cached = sess.anatomy if isinstance(sess, Session) else None
    if trace is not None and cached is not None and cached[0] == id(trace) and cached[1] == k:
        return cached[2]
    out = StepAnatomy(k)
    out.error = unavailable(trace)
    if not out.error:
        t0 = time.perf_counter()
        try:
            replay = trace.replay()
            state = replay.before(k)
            out.table = [A.what_if(state, trace.steps, _own_variant(trace, v), trace.greedy) for v in TABLE_VARIANTS]
            out.why = A.why_missed(state, trace.steps)
            out.data = A.anatomy(state, trace.greedy)
        except ReplayError as e:
            out.error = (f"This trace does not replay exactly ({e}): it was probably recorded by another version of "
                         f"RACER Studio. Its steps are shown as recorded, without the anatomy.")
        except Exception as e:  # noqa: BLE001 - a picture never breaks the inspector
            log.error("anatomy failed: %s", traceback.format_exc())
            out.error = f"The anatomy of this step could not be computed: {e.__class__.__name__}: {e}"
        out.replay_ms = (time.perf_counter() - t0) * 1e3
    if isinstance(sess, Session) and trace is not None:
        sess.anatomy = (id(trace), k, out)
    return out


def what_if(trace: Trace | None, k: int, v: A.Variant) -> tuple[dict[str, Any] | None, str]:
    """Step `k` re-drafted as `v`: (what_if result, error in plain words)."""
    err = unavailable(trace)
    if err:
        return None, err
    try:
        state = trace.replay().before(k)
        if not state.step.forwarded:
            return None, "This last step has no forward pass and no draft to change."
        return A.what_if(state, trace.steps, v, trace.greedy), ""
    except ReplayError as e:
        return None, f"This trace does not replay exactly ({e})."
    except Exception as e:  # noqa: BLE001
        log.error("what-if failed: %s", traceback.format_exc())
        return None, f"The what-if could not be computed: {e.__class__.__name__}: {e}"
