"""Figure 5: how much each step accepts.

* `acceptance_histogram({method: [accepted length per step]})`: the share of steps that
  committed 1, 2, 3, ... tokens (root + accepted drafts), one bar group per method; the mean
  is the MAT. Plain decoding is always 1.
* `acceptance_by_source(steps)`: per step, the committed tokens stacked by where they came
  from (the model's root token, retrieval, logits, both, and prompt lookup or the template
  where the drafter adds them), in the shared colour code.
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Sequence

import plotly.graph_objects as go

from . import colors as C
from .race_figure import method_name
from .text_spans import token_sources
from ._data import get


def acceptance_histogram(lengths: dict[str, Sequence[int]], *, width: int = 900, height: int = 440,
                         title: str = "Tokens committed per step") -> go.Figure:
    fig = C.blank_figure()
    cols = C.method_colors(lengths)
    top = max((max(v) for v in lengths.values() if len(v)), default=1)
    xs = list(range(1, top + 1))
    for m, ls in lengths.items():
        ls = [int(v) for v in ls]
        cnt = Counter(ls)
        n = max(1, len(ls))
        mat = sum(ls) / n
        fig.add_trace(go.Bar(
            x=xs, y=[cnt.get(x, 0) / n for x in xs], name=f"{method_name(m)} (MAT {mat:.2f}, {len(ls)} steps)",
            marker=dict(color=cols[m], line=dict(width=0)),
            customdata=[cnt.get(x, 0) for x in xs],
            hovertemplate=f"{method_name(m)}<br>%{{x}} tokens: %{{customdata}} steps (%{{y:.0%}})<extra></extra>",
            meta={"role": "hist", "method": m, "mat": mat}))
    names = [t.name for t in fig.data]
    sub = "1 = only the model's own token; each extra token is a draft the model accepted"
    fig.update_layout(**C.base_layout(title, sub, legend_names=names, width=width, height=height,
                                      barmode="group", bargap=0.2, bargroupgap=0.05))
    fig.update_xaxes(title="tokens committed in one step (root + accepted drafts)", dtick=1)
    fig.update_yaxes(title="share of steps", tickformat=".0%")
    return fig


def acceptance_by_source(steps: Sequence[Any], *, width: int = 900, height: int = 420,
                         title: str = "Where each step's committed tokens came from") -> go.Figure:
    # Every step record, numbered from 1 as the inspector's slider numbers them (the last record
    # may commit the final token without a forward pass: it is a step, and its token counts).
    per = []
    forwards = 1
    for k, s in enumerate(steps):
        forwards += 1 if get(s, "forwarded", True) else 0
        per.append((get(s, "index", k) + 1, Counter(token_sources(s))))
    present = [src for src in C.SOURCE_COLORS if any(c.get(src) for _, c in per)]
    order = [s for s in C.CORE_SOURCES if s in present or s in ("root",)] + \
        [s for s in present if s not in C.CORE_SOURCES]
    fig = C.blank_figure()
    x = [i for i, _ in per]
    for src in order:
        ys = [c.get(src, 0) for _, c in per]
        fig.add_trace(go.Bar(x=x, y=ys, name=C.SOURCE_NAMES.get(src, src),
                             marker=dict(color=C.source_color(src), line=dict(width=0)),
                             hovertemplate=f"step %{{x}}: %{{y}} {src}<extra></extra>",
                             meta={"role": "source", "key": src}))
    infos = [get(s, "info", None) or {} for s in steps]
    for src in C.legend_sources(present, infos):   # keep the whole colour code in the legend
        if src not in order:
            fig.add_trace(C.legend_traces([src], accepted=False, rejected=False)[0])
    total = sum(sum(c.values()) for _, c in per)
    drafts = total - len(per)
    share = {s: sum(c.get(s, 0) for _, c in per) for s in order if s != "root"}
    parts = ", ".join(f"{v} {k}" for k, v in share.items() if v)
    sub = (f"{total} tokens in {forwards} forward passes (the prompt's included), {len(per)} steps: "
           f"{len(per)} from the model itself + {drafts} accepted drafts" + (f" ({parts})" if parts else ""))
    names = [t.name for t in fig.data]
    fig.update_layout(**C.base_layout(title, sub, legend_names=names, width=width, height=height,
                                      barmode="stack", bargap=0.15))
    fig.update_xaxes(title="step")
    fig.update_yaxes(title="tokens committed", dtick=1 if max([sum(c.values()) for _, c in per] or [1]) <= 12 else None)
    return fig
