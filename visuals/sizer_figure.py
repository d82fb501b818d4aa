"""Stage 4 of a step's anatomy, the cut: why the sizer kept T candidates and not more.

Bars: every candidate of the merged pool, most likely to be accepted first (x0 first: it is
always "accepted"), coloured by source; kept ones solid, cut ones faded. A vertical line
separates the T kept from the rest. Line (right axis): the expected speed if the T most likely
were kept, E(T) / (forward ms at T + the step's other ms), in tokens per second. Every kept
candidate adds its chance of acceptance to E(T) but makes the forward a little slower, so the
speed rises, peaks and falls; the sizer keeps the T at the peak.
"""
from __future__ import annotations

from typing import Any, Callable

import plotly.graph_objects as go

from . import colors as C
from . import stage_common as S
from .tokens import esc_hover, token_label

SPEED_COLOR = C.METHOD_COLORS["racer"]    # the cost figure's "what RACER's tree size earns"


def _order(p: list[float], kept: list[bool]) -> list[int]:
    """Pool nodes, x0 first, then by P(accepted); kept before cut, so the T kept are the
    first T bars even when exploration or ties kept another set than the top T."""
    rest = sorted(range(1, len(p)), key=lambda i: (not kept[i], -p[i], i))
    return [0] + rest


def sizer_figure(merge: dict[str, Any], decode_one: Callable[[int], str], *, width: int = 860,
                 height: int | None = None, title: str | None = None) -> go.Figure:
    """Stage 4's cut (`anatomy["merge"]`): candidates by P(accepted), the chosen T, and the
    expected tokens/s for every T with its peak. With a fixed capacity, a figure that says so."""
    title = title or "4 · How many to verify? The sizer's cut"
    if not merge.get("auto") or not merge.get("p_accept"):
        cap = merge.get("capacity")
        return S.note_figure(title, f"This run used a fixed tree size ({cap} nodes), so nothing was cut: the "
                             "draft keeps the first candidates up to that size. Choose the size \"auto\" to let the "
                             "sizer pick it from the hardware's cost curve at every step.", width=width,
                             meta={"fixed": True, "capacity": cap})
    pool = merge["pool"]
    p = [float(v) for v in merge["p_accept"]]
    kept = [k >= 0 for k in merge.get("kept") or [0] * len(p)]
    order = _order(p, kept)
    T = int(merge["chosen_T"])
    rates = [1000.0 * float(r) for r in merge.get("rates") or []]   # tokens per ms -> per second
    exp = [float(e) for e in merge.get("expected_by_size") or []]
    cost = [float(c) for c in merge.get("cost_ms") or []]
    over = float(merge.get("overhead_ms") or 0.0)
    # The first few times T are what the choice is about; the long tail of unlikely ones is
    # summarised in words rather than drawn as invisible bars.
    shown = min(len(order), max(4 * T, 24))
    xs = list(range(1, shown + 1))

    colors, lines, hover = [], [], []
    for pos, i in enumerate(order[:shown]):
        src = pool["sources"][i]
        col = C.source_color(src)
        colors.append(col if kept[i] else C.tint(col, 0.30))
        lines.append(col)
        speed = (f"<br>keeping the first {pos + 1}: E = {exp[pos]:.2f} tokens/step, forward {cost[pos]:.1f} ms "
                 f"+ {over:.1f} ms → {rates[pos]:.0f} tokens/s" if pos < min(len(rates), len(exp), len(cost))
                 else "")
        hover.append(f"<b>{esc_hover(token_label(decode_one, pool['tokens'][i]))}</b> · {C.SOURCE_NAMES.get(src, src)}"
                     f"<br>P(accepted) = {p[i]:.3f} · depth {pool['depths'][i]}"
                     f"<br>{'kept' if kept[i] else 'cut'}{speed}<extra>#{pos + 1}</extra>")
    fig = C.TraceList()
    fig.add_trace(go.Bar(x=xs, y=[p[i] for i in order[:shown]],
                         marker=dict(color=colors, line=dict(color=lines, width=0.8)),
                         hovertemplate=hover, showlegend=False, width=0.85,
                         meta={"role": "bars", "order": order[:shown], "kept": [kept[i] for i in order[:shown]]}))
    narrow = width < 560
    ts = list(range(1, min(len(rates), shown) + 1))
    fig.add_trace(go.Scatter(x=ts, y=rates[:len(ts)], yaxis="y2", mode="lines+markers" if len(ts) <= 40 else "lines",
                             name="tokens/s if the first T are kept" if narrow else
                             "tokens/s if the first T are kept (right axis)",
                             line=dict(color=SPEED_COLOR, width=2.5), marker=dict(size=5), hoverinfo="skip",
                             meta={"role": "legend", "key": "speed"}))
    shapes, ann = [], []
    if ts:
        fig.add_trace(go.Scatter(x=[1, ts[-1]], y=[rates[0], rates[0]], yaxis="y2", mode="lines",
                                 name="no draft (x0 alone)", line=dict(color=SPEED_COLOR, width=1.2, dash="dot"),
                                 hoverinfo="skip", meta={"role": "legend", "key": "baseline"}))
    peak = max(range(len(rates)), key=lambda k: rates[k]) + 1 if rates else None
    if T <= len(rates):
        fig.add_trace(go.Scatter(x=[T], y=[rates[T - 1]], yaxis="y2", mode="markers", showlegend=False,
                                 marker=dict(symbol="star", size=15, color=C.ACCEPTED_COLOR),
                                 hoverinfo="skip", meta={"role": "chosen"}))
    shapes.append(dict(type="line", xref="x", yref="paper", x0=T + 0.5, x1=T + 0.5, y0=0, y1=1,
                       line=dict(color=C.ACCEPTED_COLOR, width=1.6, dash="dash")))
    for text, anchor in (("<b>kept</b> ← ", "right"), (" → <b>cut</b>", "left")):
        ann.append(dict(x=T + 0.5, y=1.0, xref="x", yref="paper", yanchor="top", xanchor=anchor, showarrow=False,
                        text=text, font=dict(size=12), bgcolor="rgba(255,255,255,0.8)"))
    for t in S.source_legend(pool["sources"][i] for i in order):
        fig.add_trace(t)
    fig.add_trace(S.legend_key("cut by the sizer (faded)", "cut", color=C.tint(C.SOURCE_COLORS["root"], 0.30),
                               line_color=C.SOURCE_COLORS["root"], line_width=1))

    sub = ("Bars: every candidate, most likely to be accepted first. Each one kept adds its chance to the "
           "expected tokens per step, E(T), but makes the model's pass slower; the line is the speed that "
           f"gives. The sizer keeps the T at its peak: {T} of {len(order)}")
    if T <= min(len(rates), len(exp)):
        sub += (f", E = {exp[T - 1]:.2f} tokens per step → {rates[T - 1]:.0f} tokens/s expected "
                f"(x0 alone: {rates[0]:.0f}).")
    else:
        sub += "."
    if shown < len(order):
        sub += f" The {len(order) - shown} least likely are not drawn."
    if merge.get("explore"):
        sub += (" This step explored: it verified a few candidates to learn how often they are accepted, "
                "not the fastest size.")
    margin = dict(l=48 if narrow else 60, r=52 if narrow else 64, b=50)
    plot_w = width - margin["l"] - margin["r"]
    title_w = S.wrap(title, width - 20, S.TITLE_SIZE)
    sub_w = S.wrap(sub, width - 20, S.SUB_SIZE)
    names = [t.name for t in fig.data if t.meta and t.meta.get("role") == "legend"]
    margin["t"] = S.top_margin(title_w, sub_w, names, plot_w)
    plot_h = 250 if narrow else 300
    layout = C.base_layout(title_w, sub_w, width=width, height=height or plot_h + margin["t"] + margin["b"],
                           margin=margin, shapes=shapes, annotations=ann, bargap=0.1, hovermode="closest",
                           meta={"chosen_T": T, "peak_T": peak, "order": order, "shown": shown,
                                 "explore": bool(merge.get("explore"))})
    layout["xaxis"] = dict(title=dict(text="candidates, most likely first" if narrow else
                                      "candidates, most likely first (T = how many are kept)"),
                           range=[0.4, shown + 0.6], showgrid=False, zeroline=False)
    layout["yaxis"] = dict(title=dict(text="P(accepted)"), range=[0, 1.16], tickvals=[0, 0.25, 0.5, 0.75, 1.0],
                           tickformat=".0%")
    top = 1.22 * max(rates[:shown] or [1.0])
    layout["yaxis2"] = dict(title=dict(text="tokens / s", font=dict(color=SPEED_COLOR)), overlaying="y", side="right",
                            range=[0, top], tickformat=".0f", tickfont=dict(color=SPEED_COLOR), showgrid=False)
    return fig.figure(layout)
