"""The step inspector: pure renders of a recorded trace at one step (never runs the model)."""
from __future__ import annotations

import logging
import traceback
from dataclasses import dataclass
from typing import Any

import plotly.graph_objects as go

from visuals import automaton_figure, cost_figure, draft_tree_figure
from visuals.colors import blank_figure

from .format import current_step_spans, rows_html, step_sentence
from .session import Trace

#: Tree and automaton figures are laid out in pixels, at most this wide.
FIG_WIDTH = 860


def fig_width(viewport: Any) -> int:
    """Pixel width for the tree and automaton figures given the browser's viewport width (the
    page sends it on load); narrow screens get narrower figures rather than clipped ones."""
    try:
        vw = int(float(viewport))
    except (TypeError, ValueError):
        return FIG_WIDTH
    if vw <= 0:
        return FIG_WIDTH
    return max(300, min(FIG_WIDTH, vw - 56))
log = logging.getLogger("racer_app")


@dataclass
class StepView:
    index: int
    sentence: str
    tree: go.Figure
    automaton: go.Figure
    rows: str
    spans: list[tuple[str, str | None]]
    cost: go.Figure | None = None      # only for steps sized automatically


def step_cost_data(trace: Trace, step: Any) -> dict[str, Any] | None:
    """`visuals.cost_figure` input for a step sized automatically: exactly what the sizer weighed,
    from the step record (the forward ms it assumed per tree size T, the expected tokens per
    step E(T) and the expected tokens per second with the step's overhead), so the figure's E
    at the chosen T is the sentence's "expecting E tokens"."""
    info = getattr(step, "info", None) or {}
    rates = info.get("rates")          # expected tokens per ms for T = 1, 2, ... (racer.sizing)
    if not rates or info.get("chosen_T") is None:
        return None
    n = len(rates)
    chosen = int(info["chosen_T"])
    sizes = sorted(set([1, n] + list(range(2, n + 1, max(1, n // 24))) + ([chosen] if chosen <= n else [])))
    exp_all, cost_all = info.get("expected_by_size"), info.get("cost_ms")
    if exp_all and cost_all and len(exp_all) >= n and len(cost_all) >= n:
        ms = [float(cost_all[t - 1]) for t in sizes]
        expected = [float(exp_all[t - 1]) for t in sizes]
    else:
        # A trace recorded before the sizer kept these: the curve, and E back from the rates.
        curve = trace.cost_curve
        if curve is None:
            return None
        ms = [float(curve.t(t, step.context_len)) for t in sizes]
        expected = [float(rates[t - 1]) * m / 1e3 for t, m in zip(sizes, ms)]
    return {"sizes": sizes, "ms": ms, "expected_tokens": expected,
            "tokens_per_s": [float(rates[t - 1]) * 1e3 for t in sizes], "chosen_T": int(info["chosen_T"])}


def fluid(fig: go.Figure, viewport: Any = None) -> go.Figure:
    """Let a chart take its container's width (phones included). Only for charts whose layout
    does not depend on pixel sizes (the tree and automaton figures do: they are drawn for the
    viewport's width instead). On a narrow screen the one-line subtitle (plotly cannot wrap it)
    is dropped and a long title shortened, rather than clipped."""
    fig.update_layout(width=None, autosize=True)
    narrow = _narrow_title(fig.layout.title.text if fig.layout.title is not None else None, viewport)
    if narrow is not None:
        fig.update_layout(title_subtitle_text="", title_text=narrow)
    return fig


def fluid_spec(spec: dict[str, Any], viewport: Any = None) -> dict[str, Any]:
    """`fluid` for a figure given as plain plotly JSON (visuals.race_figure.race_figure_spec); in place."""
    layout = spec["layout"]
    layout.pop("width", None)
    layout["autosize"] = True
    title = layout.get("title")
    narrow = _narrow_title(title.get("text") if isinstance(title, dict) else None, viewport)
    if narrow is not None:
        title["text"] = narrow
        title.setdefault("subtitle", {})["text"] = ""
    return spec


def _narrow_title(text: str | None, viewport: Any) -> str | None:
    """On a screen under 700 px wide, the title to show without its subtitle (shortened to fit);
    None on a wider screen or for a chart with no title."""
    try:
        vw = int(float(viewport or 0))
    except (TypeError, ValueError):
        vw = 0
    if not 0 < vw < 700 or text is None:
        return None
    room = max(16, (vw - 48) // 10)
    return text[: room - 1].rstrip(" :,") + "…" if len(text) > room else text


def empty_figure(message: str, height: int = 180) -> go.Figure:
    fig = blank_figure()
    fig.update_layout(height=height, margin=dict(l=10, r=10, t=10, b=10), paper_bgcolor="white",
                      plot_bgcolor="white", xaxis=dict(visible=False), yaxis=dict(visible=False),
                      annotations=[dict(text=message, x=0.5, y=0.5, xref="paper", yref="paper",
                                        showarrow=False, font=dict(size=14, color="#555"))])
    return fig


def clamp_step(trace: Trace | None, k: Any) -> int:
    if trace is None or trace.n == 0:
        return 0
    try:
        k = int(round(float(k)))
    except (TypeError, ValueError):
        k = 0
    return min(max(k, 0), trace.n - 1)


def _figure(build: Any, width: int, what: str) -> go.Figure:
    """A figure at `width`; if the builder fails at that width, at the full width (the page
    then scrolls sideways), else a note. A picture never breaks the inspector."""
    for w in dict.fromkeys((width, FIG_WIDTH)):
        try:
            return build(w)
        except Exception:  # noqa: BLE001
            log.warning("%s figure failed at width %s:\n%s", what, w, traceback.format_exc())
    return empty_figure(f"The {what} picture could not be drawn for this step.")


def render_step(trace: Trace, k: int, width: int = FIG_WIDTH) -> StepView:
    k = clamp_step(trace, k)
    step = trace.steps[k]
    decode = trace.decode_one
    tree = _figure(lambda w: draft_tree_figure(step, decode, width=w, title=f"Draft tree of step {k + 1}"),
                   width, "draft tree")
    snap = (step.info or {}).get("automaton")
    if snap:
        auto = _figure(lambda w: automaton_figure(snap, decode, width=w,
                                                  title=f"Automaton around the match state, step {k + 1}"),
                       width, "automaton")
    elif k >= trace.detail_steps:
        auto = empty_figure(f"No automaton picture for step {k + 1}: this server keeps pictures for the first "
                            f"{trace.detail_steps} steps.")
    else:
        auto = empty_figure("No automaton in this step (retrieval off, or the run's final commit).")
    spans, step_of = trace.spans()
    cost = None
    data = step_cost_data(trace, step)
    if data is not None:
        cost = fluid(cost_figure(data, width=width, height=380, title=f"Why step {k + 1} kept {data['chosen_T']} nodes",
                           hardware=f"this machine, context {step.context_len} tokens"), width + 56)
    return StepView(k, step_sentence(step, trace.decode_many, trace.n), tree, auto,
                    rows_html(step, decode), current_step_spans(spans, step_of, step.index), cost)


def step_of_span(trace: Trace | None, span_index: Any) -> int | None:
    """The step that produced the clicked span of the inspector's text (None: the prompt)."""
    if trace is None:
        return None
    _, step_of = trace.spans()
    try:
        i = int(span_index if not isinstance(span_index, (list, tuple)) else span_index[0])
    except (TypeError, ValueError):
        return None
    if not 0 <= i < len(step_of) or step_of[i] < 0:
        return None
    idx = step_of[i]
    # step_of holds StepRecord.index values; map back to the list position.
    for pos, s in enumerate(trace.steps):
        if s.index == idx:
            return pos
    return None
