"""What the "anatomy of a step" figures share: text that wraps to the figure's width, the
kept / cut look of candidates, and the frame (title, subtitle, legend, pixel axes).

The anatomy figures are drawn in screen pixels (one axis unit = one pixel), like the draft
tree, so that label sizes can be planned before anything is drawn and the pictures hold
together from a 340 px phone to an 860 px desktop column.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

import plotly.graph_objects as go

from . import colors as C
from .tokens import esc, token_label, truncate

#: Average advance of the sans-serif font as a fraction of its size (for wrapping prose).
SANS_ADVANCE = 0.56
TITLE_SIZE = 17
SUB_SIZE = 12
#: Fill of a candidate the sizer cut (hollow: the page shows through).
HOLLOW = "#FFFFFF"
#: The outline of a cut candidate, plotly's dash name.
CUT_DASH = "dot"


def wrap(text: str, width_px: float, font: float = SUB_SIZE) -> str:
    """`text` with '<br>' line breaks so no line is wider than `width_px` (an estimate for the
    sans font); breaks already in `text` are kept. Tags (<b>…</b>) do not count as width."""
    per_line = max(12, int(width_px / (SANS_ADVANCE * font)))
    out = []
    for para in text.split("<br>"):
        line, used = [], 0
        for word in para.split(" "):
            w = _visible_len(word)
            if line and used + 1 + w > per_line:
                out.append(" ".join(line))
                line, used = [], 0
            used += w + (1 if line else 0)
            line.append(word)
        out.append(" ".join(line))
    return "<br>".join(out)


def _visible_len(word: str) -> int:
    n, inside = 0, False
    for ch in word:
        if ch == "<":
            inside = True
        elif ch == ">" and inside:
            inside = False
        elif not inside:
            n += 1
    return n


def lines(text: str | None) -> int:
    return 0 if not text else text.count("<br>") + 1


def quoted(decode: Callable[[int], str], token: int, max_cells: int = 14) -> str:
    """‘token’ with whitespace made visible, cut to `max_cells`, HTML-escaped."""
    return "‘" + esc(truncate(token_label(decode, token), max_cells)) + "’"


def legend_rows(names: Iterable[str], width: float, font: float = 12) -> int:
    """Rows of a horizontal plotly legend: one row when every entry fits side by side, else a
    grid of columns as wide as the widest entry."""
    widths = [44 + 0.5 * font * len(n) for n in names]     # measured: about 0.48 em a character
    if not widths:
        return 0
    if sum(widths) <= width:
        return 1
    per_row = max(1, int(width // max(widths)))
    return -(-len(widths) // per_row)


def top_margin(title: str, subtitle: str | None, legend_names: Iterable[str], plot_w: float) -> int:
    """Top margin for a (possibly wrapped) title, its subtitle and a horizontal legend."""
    return int(14 + 22 * lines(title) + 16 * lines(subtitle) + 21 * legend_rows(legend_names, plot_w) + 12)


def frame(fig: C.TraceList, title: str, subtitle: str | None, *, width: int, plot_h: float,
          margin: dict[str, float], x_range: tuple[float, float], y_range: tuple[float, float],
          meta: dict[str, Any] | None = None, **kw: Any) -> go.Figure:
    """The figure, its pixel axes matching the plot area, title and subtitle wrapped to fit."""
    plot_w = width - margin["l"] - margin["r"]
    title = wrap(title, width - 20, TITLE_SIZE)
    subtitle = wrap(subtitle, width - 20, SUB_SIZE) if subtitle else None
    names = [t.name for t in fig.data if t.meta and t.meta.get("role") == "legend"]
    margin = dict(margin)
    margin["t"] = top_margin(title, subtitle, names, plot_w)
    height = int(round(plot_h + margin["t"] + margin["b"]))
    layout = C.base_layout(title, subtitle, margin=margin, width=width, height=height, showlegend=bool(names),
                           hovermode="closest", meta=meta or {},
                           xaxis=dict(visible=False, range=list(x_range), fixedrange=True),
                           yaxis=dict(visible=False, range=list(y_range), fixedrange=True), **kw)
    return fig.figure(layout)


def note_figure(title: str, message: str, *, width: int = 860, meta: dict[str, Any] | None = None) -> go.Figure:
    """A figure that only says something (a stage that did not run, a fixed tree size)."""
    fig = C.TraceList()
    fig.add_trace(go.Scatter(x=[None], y=[None], showlegend=False, hoverinfo="skip"))
    msg = wrap(esc(message), width - 40, 13)
    h = 30 + 19 * lines(msg)
    ann = [dict(x=0, y=h / 2, xref="x", yref="y", xanchor="left", yanchor="middle", showarrow=False,
                align="left", text=msg, font=dict(size=13, color="#333333"))]
    return frame(fig, title, None, width=width, plot_h=h, margin=dict(l=20, r=20, b=10),
                 x_range=(0, width - 40), y_range=(0, h), meta=dict(meta or {}, note=message), annotations=ann)


def legend_key(name: str, key: str, *, color: str, symbol: str = "square", line_color: str | None = None,
               line_width: float = 0.0, dash: str | None = None, mode: str = "markers") -> go.Scatter:
    """One legend entry with no data (role "legend", like `colors.legend_traces`)."""
    if mode == "lines":
        return go.Scatter(x=[None], y=[None], mode="lines", name=name, hoverinfo="skip",
                          line=dict(color=color, width=max(line_width, 2), dash=dash),
                          meta={"role": "legend", "key": key})
    return go.Scatter(x=[None], y=[None], mode="markers", name=name, hoverinfo="skip",
                      marker=dict(symbol=symbol, size=13, color=color,
                                  line=dict(color=line_color or color, width=line_width)),
                      meta={"role": "legend", "key": key})


def kept_cut_legend() -> list[go.Scatter]:
    """How a kept candidate (solid) and a cut one (hollow) look, in the source colours' place."""
    grey = C.SOURCE_COLORS["root"]
    return [legend_key("kept: verified by the model", "kept", color=grey),
            legend_key("cut by the sizer (hollow)", "cut", color=HOLLOW, symbol="square",
                       line_color=grey, line_width=2)]


def source_legend(sources: Iterable[str]) -> list[go.Scatter]:
    """The source colours present in a picture, in the shared order (no path entries)."""
    present = set(sources)
    order = list(C.CORE_SOURCES) + ["lookup", "template"]
    return C.legend_traces([s for s in order if s in present], accepted=False, rejected=False)
