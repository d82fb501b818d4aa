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


def race_figure_spec(race: dict[str, dict[str, Any]], *, width: int | None = 900, height: int = 460,
                     title: str = "Race: tokens generated against compute time",
                     prefill_s: float | None = None) -> dict[str, Any]:
    """The race figure as plain plotly JSON ({"data", "layout"}, the template included): what a live
    race streams several times a second. Building it through plotly's validated objects took
    35-50 ms a frame on a 2-core CPU, most of it copying the template, on the server's cores
    between a race's steps; this takes a fraction of a millisecond, and `race_figure` checks it
    against plotly's own validation (tests/test_visuals.py)."""
    shapes, ann = [], []
    if prefill_s:
        shapes.append({"type": "rect", "x0": -prefill_s, "x1": 0, "xref": "x", "y0": 0, "y1": 1, "yref": "y domain",
                       "fillcolor": "#DDDDDD", "opacity": 0.6, "line": {"width": 0}, "layer": "below"})
        ann.append({"text": "prefill", "x": -prefill_s, "xref": "x", "xanchor": "left", "y": 1, "yref": "y domain",
                    "yanchor": "top", "showarrow": False, "font": {"size": 11, "color": "#555555"}})
    cols = C.method_colors(race)
    data, finals = [], []
    for m, d in race.items():
        pts = list(d.get("points") or [])
        final = d.get("final") or {}
        xs = [float(p[0]) for p in pts]
        ys = [int(p[1]) for p in pts]
        if prefill_s and pts:
            xs, ys = [-prefill_s] + xs, [0] + ys     # no token during the prefill
        tps, mat = final.get("tokens_per_s"), final.get("mat")
        stats = []
        if tps is not None:
            stats.append(f"{tps:.1f} tok/s")
        if mat is not None:
            stats.append(f"MAT {mat:.2f}")
        is_ar = C.method_key(m) == "ar"
        data.append({"type": "scatter", "x": xs, "y": ys, "mode": "lines",
                     "name": method_name(m) + (f" — {', '.join(stats)}" if stats else ""),
                     "line": {"color": cols[m], "width": 2.2 if is_ar else 3, "dash": "dash" if is_ar else "solid",
                              "shape": "hv"},
                     "hovertemplate": f"{method_name(m)}<br>%{{x:.2f}} s: %{{y}} tokens<extra></extra>",
                     "meta": {"role": "race", "method": m}})
        if pts:
            finals.append((ys[-1], m, stats))
    # end labels in the right margin at each line's final height, nudged apart vertically;
    # ordered by speed (fastest on top) when lines end at the same height
    ymax = max([f[0] for f in finals] or [1]) or 1
    tps_of = {m: (race[m].get("final") or {}).get("tokens_per_s") or 0 for m in race}
    last = None
    for y, m, stats in sorted(finals, key=lambda f: (-f[0], -tps_of[f[1]])):
        yy = y if last is None else min(y, last - 0.11 * ymax)
        last = yy
        ann.append({"x": 1.0, "xref": "paper", "y": yy, "xanchor": "left", "yanchor": "middle", "xshift": 8,
                    "showarrow": False, "text": f"<b>{method_name(m)}</b><br>{' · '.join(stats)}", "align": "left",
                    "font": {"size": 11, "color": cols[m]}})
    sub = ("Each method advanced by its own measured compute, so the lines compare equal work; "
           "MAT = tokens committed per forward pass"
           + ("; shaded: the prefill, the same prompt for every method" if prefill_s else ""))
    layout = C.base_layout(title, sub, legend_names=[t["name"] for t in data], width=width, height=height,
                           hovermode="x unified", margin=dict(l=60, r=150, t=110, b=50))
    layout.update(
        template=C.white_template(), annotations=ann,
        xaxis={"title": {"text": "own decoding time (s)" if prefill_s else "own compute time (s)"},
               "rangemode": "normal" if prefill_s else "tozero", "showline": True, "linecolor": "#999"},
        yaxis={"title": {"text": "tokens generated"}, "rangemode": "tozero", "showline": True, "linecolor": "#999"})
    if shapes:
        layout["shapes"] = shapes
    return {"data": data, "layout": layout}


def race_figure(race: dict[str, dict[str, Any]], *, width: int = 900, height: int = 460,
                title: str = "Race: tokens generated against compute time", prefill_s: float | None = None) -> go.Figure:
    return go.Figure(race_figure_spec(race, width=width, height=height, title=title, prefill_s=prefill_s))
