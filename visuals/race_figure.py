"""Figure 4: the race — tokens generated against each method's own compute time.

Input: {method: {"points": [(elapsed_s, tokens_so_far), ...], "final": {"tokens_per_s": x,
"mat": y}}}. Each method is a step line (tokens arrive in bursts: one
forward can commit several). The steeper line is the faster method; the legend and the end
labels give the final tokens/s and MAT (mean tokens committed per forward pass).

With `prefill_s`, the x axis starts at -prefill_s: a shaded segment before zero is the prefill,
the same prompt read by every method, and every line starts after it at zero.
"""
from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from . import colors as C

#: By racer.palette's method keys (so "tr", "token_recycling" and "Token Recycling" are one).
_NAMES = {"ar": "plain autoregressive", "racer": "RACER", "tr": "Token Recycling", "pld": "prompt lookup"}


def method_name(method: str) -> str:
    return _NAMES.get(C.method_key(method), method)


def race_figure(race: dict[str, dict[str, Any]], *, width: int = 900, height: int = 460,
                title: str = "Race: tokens generated against compute time", prefill_s: float | None = None) -> go.Figure:
    fig = go.Figure()
    if prefill_s:
        fig.add_vrect(x0=-prefill_s, x1=0, fillcolor="#DDDDDD", opacity=0.6, line_width=0, layer="below",
                      annotation_text="prefill", annotation_position="top left",
                      annotation_font=dict(size=11, color="#555555"))
    cols = C.method_colors(race)
    finals = []
    for m, d in race.items():
        pts = list(d.get("points") or [])
        final = d.get("final") or {}
        xs = [p[0] for p in pts]
        ys = [p[1] for p in pts]
        if prefill_s and pts:
            xs, ys = [-prefill_s] + xs, [0] + ys     # no token during the prefill
        tps, mat = final.get("tokens_per_s"), final.get("mat")
        stats = []
        if tps is not None:
            stats.append(f"{tps:.1f} tok/s")
        if mat is not None:
            stats.append(f"MAT {mat:.2f}")
        label = method_name(m) + (f" — {', '.join(stats)}" if stats else "")
        is_ar = C.method_key(m) == "ar"
        fig.add_trace(go.Scatter(
            x=xs, y=ys, mode="lines", line_shape="hv", name=label,
            line=dict(color=cols[m], width=2.2 if is_ar else 3, dash="dash" if is_ar else "solid"),
            hovertemplate=f"{method_name(m)}<br>%{{x:.2f}} s: %{{y}} tokens<extra></extra>",
            meta={"role": "race", "method": m}))
        if pts:
            finals.append((xs[-1], ys[-1], m, stats))
    # end labels in the right margin at each line's final height, nudged apart vertically;
    # ordered by speed (fastest on top) when lines end at the same height
    ann = []
    ymax = max([f[1] for f in finals] or [1]) or 1
    tps_of = {m: (race[m].get("final") or {}).get("tokens_per_s") or 0 for m in race}
    last = None
    for x, y, m, stats in sorted(finals, key=lambda f: (-f[1], -tps_of[f[2]])):
        yy = y if last is None else min(y, last - 0.11 * ymax)
        last = yy
        ann.append(dict(x=1.0, xref="paper", y=yy, xanchor="left", yanchor="middle", xshift=8, showarrow=False,
                        text=f"<b>{method_name(m)}</b><br>{' · '.join(stats)}", align="left",
                        font=dict(size=11, color=cols[m])))
    names = [t.name for t in fig.data]
    sub = ("Each method advanced by its own measured compute, so the lines compare equal work; "
           "MAT = tokens committed per forward pass"
           + ("; shaded: the prefill, the same prompt for every method" if prefill_s else ""))
    fig.update_layout(**C.base_layout(title, sub, legend_names=names, width=width, height=height,
                                      annotations=ann, hovermode="x unified",
                                      margin=dict(l=60, r=150, t=110, b=50)))
    fig.update_xaxes(title="own decoding time (s)" if prefill_s else "own compute time (s)",
                     rangemode="normal" if prefill_s else "tozero", showline=True, linecolor="#999")
    fig.update_yaxes(title="tokens generated", rangemode="tozero", showline=True, linecolor="#999")
    return fig
