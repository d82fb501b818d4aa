"""Figure 7: the cost curve that decides the tree size on this hardware.

Input: {"sizes": [T, ...], "ms": [verify-forward ms at T], "chosen_T": int, optional
"expected_tokens": [E(T): expected tokens committed per step with a T-node tree], optional
"tokens_per_s": [expected tokens/s at T, when the sizer already computed it (it includes the
per-step overhead)], optional "hardware": str}. `cost_curve_from_step` builds it from a
step record of the sizing policy (info "rates", "chosen_T", "expected_accept") and the cost
curve object (anything with `.table(context, sizes) -> {"sizes", "ms"}`). Left axis: what one verify forward costs as the tree grows. Right axis:
expected tokens/s = E(T) / t(T). The chosen size is marked. Verifying more candidates
accepts more tokens, but each forward gets slower; the best T is where the right-hand
curve peaks, and that depends on the hardware.
"""
from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from . import colors as C

MS_COLOR = C.PHASE_COLORS["forward"]    # the cost of the verify forward
TPS_COLOR = C.METHOD_COLORS["racer"]    # what RACER's tree size earns


def cost_figure(curve: dict[str, Any], *, width: int = 900, height: int = 460, hardware: str | None = None,
                title: str = "Cost curve: what a bigger draft tree costs") -> go.Figure:
    sizes = [int(t) for t in curve["sizes"]]
    ms = [float(v) for v in curve["ms"]]
    exp = curve.get("expected_tokens")
    given_tps = curve.get("tokens_per_s")
    marker = dict(size=7) if len(sizes) <= 24 else dict(size=4)
    chosen = curve.get("chosen_T")
    hw = hardware or curve.get("hardware")
    fig = C.blank_figure()
    fig.add_trace(go.Scatter(x=sizes, y=ms, mode="lines+markers", name="verify forward (ms, left axis)",
                             line=dict(color=MS_COLOR, width=2.5), marker=marker,
                             hovertemplate="T = %{x} nodes: %{y:.1f} ms per forward<extra></extra>",
                             meta={"role": "ms"}))
    ann = []
    shapes = []
    tps = None
    if given_tps is not None:
        tps = [float(v) for v in given_tps]
    elif exp is not None:
        tps = [1000.0 * e / t if t > 0 else 0.0 for e, t in zip(exp, ms)]
    if tps is not None:
        hov = ("T = %{x}: E = %{customdata:.2f} tokens/step → %{y:.1f} tok/s<extra></extra>" if exp is not None
               else "T = %{x}: %{y:.1f} tok/s expected<extra></extra>")
        fig.add_trace(go.Scatter(x=sizes, y=tps, mode="lines+markers", yaxis="y2",
                                 name="expected tokens/s = E(T) / t(T) (right axis)",
                                 line=dict(color=TPS_COLOR, width=3), marker=marker,
                                 customdata=list(exp) if exp is not None else None, hovertemplate=hov,
                                 meta={"role": "tps"}))
        base = 1000.0 / ms[sizes.index(1)] if 1 in sizes else None
        if base:
            fig.add_trace(go.Scatter(x=[sizes[0], sizes[-1]], y=[base, base], mode="lines", yaxis="y2",
                                     name=f"plain decoding ({base:.1f} tok/s)",
                                     line=dict(color=TPS_COLOR, width=1.5, dash="dot"), hoverinfo="skip",
                                     meta={"role": "baseline"}))
    if chosen is not None and chosen in sizes:
        i = sizes.index(chosen)
        shapes.append(dict(type="line", xref="x", yref="paper", x0=chosen, x1=chosen, y0=0, y1=1,
                           line=dict(color="#000000", width=1.5, dash="dash")))
        text = f"<b>chosen T = {chosen}</b><br>{ms[i]:.0f} ms per forward"
        if tps is not None:
            if exp is not None:
                text += f"<br>E = {exp[i]:.2f} tokens → {tps[i]:.1f} tok/s"
            elif curve.get("expected_accept") is not None:
                text += f"<br>E = {float(curve['expected_accept']):.2f} tokens → {tps[i]:.1f} tok/s"
            else:
                text += f"<br>{tps[i]:.1f} tok/s expected"
            fig.add_trace(go.Scatter(x=[chosen], y=[tps[i]], yaxis="y2", mode="markers",
                                     name="chosen size", marker=dict(symbol="star", size=18, color="#000000"),
                                     hoverinfo="skip", meta={"role": "chosen"}))
        else:
            fig.add_trace(go.Scatter(x=[chosen], y=[ms[i]], mode="markers", name="chosen size",
                                     marker=dict(symbol="star", size=18, color="#000000"), hoverinfo="skip",
                                     meta={"role": "chosen"}))
        ann.append(dict(x=chosen, y=0.02, xref="x", yref="paper", yanchor="bottom", xanchor="left", xshift=8,
                        showarrow=False, align="left", text=text, font=dict(size=12),
                        bgcolor="rgba(255,255,255,0.9)"))
    names = [t.name for t in fig.data]
    sub = ("Bigger trees accept more tokens per step but each forward costs more; "
           "the best size is where tokens/s peaks" + (f"<br>Measured on {hw}" if hw else ""))
    layout = C.base_layout(title, sub, legend_names=names, width=width, height=height, shapes=shapes,
                           annotations=ann, hovermode="x unified", margin=dict(l=70, r=80, t=110, b=55))
    layout["yaxis2"] = dict(title=dict(text="expected tokens / s", font=dict(color=TPS_COLOR)), overlaying="y",
                            side="right", rangemode="tozero", tickfont=dict(color=TPS_COLOR), showgrid=False,
                            tickmode="auto", nticks=8)
    fig.update_layout(**layout)
    fig.update_xaxes(title="draft tree size T (nodes verified in one forward)", rangemode="tozero")
    fig.update_layout(yaxis=dict(title=dict(text="ms per verify forward", font=dict(color=MS_COLOR)),
                                 rangemode="tozero"))
    return fig


def cost_curve_from_step(step: Any, curve: Any, hardware: str | None = None) -> dict[str, Any]:
    """Cost-figure input from a sized step: info "rates" (expected tokens per ms for T = 1..n,
    as scaled by the sizer: tokens/s) plus the forward ms sizing assumed (info "cost_ms"; the
    curve's at the step's context for records without it)."""
    from ._data import get
    info = dict(get(step, "info", None) or {})
    rates = list(info.get("rates") or [])
    sizes = list(range(1, len(rates) + 1)) or list(getattr(curve, "sizes", [1]))
    table = curve.table(int(get(step, "context_len", 0) or 0), sizes)
    # Sizing's own costs when recorded (the curve, scaled by the decoding's own forwards where the
    # sizer calibrates: Sizer(calibrate=True)).
    ms = list(info.get("cost_ms") or [])
    if len(ms) != len(table["sizes"]):
        ms = list(table["ms"])
    out: dict[str, Any] = {"sizes": list(table["sizes"]), "ms": ms, "chosen_T": info.get("chosen_T")}
    if rates:
        out["tokens_per_s"] = [float(r) for r in rates]
    if info.get("expected_accept") is not None:
        out["expected_accept"] = info["expected_accept"]
    if hardware:
        out["hardware"] = hardware
    return out
