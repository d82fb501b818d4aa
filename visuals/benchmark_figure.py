"""Figure 8: benchmark — MAT and speedup per category, per method.

Input (racer/bench's summary):
    {"methods": {method: {"overall": {"mat": float, "tokens_per_s": float, "speedup_vs_ar": float},
                          "categories": {category: {same keys}}}},
     optional "hardware": str, "model": str}
Top panel: MAT (mean tokens committed per forward pass); bottom: speedup over plain
autoregressive decoding in wall-clock time (dotted line at 1×: below it the method is slower).
The last group, "overall", is the mean over all prompts.
"""
from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from . import colors as C
from .race_figure import method_name


def benchmark_figure(summary: dict[str, Any], *, width: int = 900, height: int = 640,
                     title: str = "Benchmark: accepted tokens and speedup by task") -> go.Figure:
    methods = summary.get("methods") or {}
    cats: list[str] = []
    for d in methods.values():
        for c in (d.get("categories") or {}):
            if c not in cats:
                cats.append(c)
    groups = cats + ["overall"]
    labels = [c.replace("_", " ") for c in cats] + ["<b>overall</b>"]
    cols = C.method_colors(methods)
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.07, figure=C.blank_figure())
    for m, d in methods.items():
        def val(g, key):
            src = d.get("overall") if g == "overall" else (d.get("categories") or {}).get(g)
            return None if not src or src.get(key) is None else float(src[key])
        mats = [val(g, "mat") for g in groups]
        sps = [val(g, "speedup_vs_ar") for g in groups]
        tps = [val(g, "tokens_per_s") for g in groups]
        name = method_name(m)
        fig.add_trace(go.Bar(x=labels, y=mats, name=name, legendgroup=m, marker_color=cols[m],
                             customdata=tps, hovertemplate=f"{name}<br>%{{x}}: MAT %{{y:.2f}}<extra></extra>",
                             meta={"role": "mat", "method": m}), row=1, col=1)
        fig.add_trace(go.Bar(x=labels, y=sps, name=name, legendgroup=m, marker_color=cols[m], showlegend=False,
                             customdata=tps,
                             hovertemplate=f"{name}<br>%{{x}}: %{{y:.2f}}× (%{{customdata:.1f}} tok/s)<extra></extra>",
                             meta={"role": "speedup", "method": m}), row=2, col=1)
    fig.add_hline(y=1.0, line=dict(color="#000000", width=1.2, dash="dot"), row=2, col=1)
    fig.add_vrect(x0=len(cats) - 0.5, x1=len(cats) + 0.5, fillcolor="#F2F2F2", line_width=0, layer="below",
                  row="all", col=1)
    bits = [summary.get("model"), summary.get("hardware")]
    sub = "Higher is better; speedup below the dotted 1× line means slower than plain decoding"
    if any(bits):
        sub += "<br>" + " · ".join(b for b in bits if b)
    names = [method_name(m) for m in methods]
    fig.update_layout(**C.base_layout(title, sub, legend_names=names, width=width, height=height, barmode="group",
                                      bargap=0.2, margin=dict(l=80, r=30, t=110, b=80)))
    fig.update_yaxes(title="MAT (tokens<br>per forward)", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title="speedup vs<br>plain decoding (×)", rangemode="tozero", row=2, col=1)
    return fig
