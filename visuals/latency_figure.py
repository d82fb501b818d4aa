"""Figure 6: where the time goes — draft / forward / verify / cache / update / sizing.

Input: {method: run}, where run is either a `DecodeResult.to_dict()`-like dict
({"timings": {"draft_ms": total, "forward_ms": total, ...}, "steps": n, "new_tokens": n}) or a
list of step records (their per-step `timings` are summed). Bars are stacked per method in
milliseconds per generated token (default) or per step. The forward pass dominates; RACER
pays a little drafting and updating to need fewer forwards per token.
"""
from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from . import colors as C
from ._data import get
from .race_figure import method_name


def latency_totals(run: Any) -> tuple[dict[str, float], int, int]:
    """(phase -> total ms, steps, generated tokens) of a run dict or a list of step records."""
    if isinstance(run, dict):
        totals = {k[:-3] if k.endswith("_ms") else k: float(v) for k, v in (run.get("timings") or {}).items()}
        steps = int(run.get("steps") or 0)
        tokens = int(run.get("new_tokens") or run.get("tokens") or 0)
        return totals, steps, tokens
    totals: dict[str, float] = {}
    steps = tokens = 0
    for s in run:
        for k, v in (get(s, "timings", {}) or {}).items():
            key = k[:-3] if k.endswith("_ms") else k
            totals[key] = totals.get(key, 0.0) + float(v)
        steps += 1 if get(s, "forwarded", True) else 0
        tokens += len(get(s, "committed", []) or [])
    return totals, steps, tokens


def latency_figure(runs: dict[str, Any], *, per: str = "token", width: int = 900, height: int | None = None,
                   title: str = "Latency breakdown") -> go.Figure:
    methods = list(runs)
    data = {m: latency_totals(runs[m]) for m in methods}
    phases = [p for p in C.PHASES if any(data[m][0].get(p) for m in methods)]
    others = sorted({k for m in methods for k in data[m][0] if k not in C.PHASES and k != "prefill"})
    names_y = [method_name(m) for m in methods]
    fig = C.blank_figure()

    def denom(m):
        _, steps, tokens = data[m]
        return max(1, tokens if per == "token" else steps)

    for p in phases + others:
        vals = [data[m][0].get(p, 0.0) / denom(m) for m in methods]
        fig.add_trace(go.Bar(
            y=names_y, x=vals, orientation="h", name=C.PHASE_NAMES.get(p, p),
            marker=dict(color=C.PHASE_COLORS.get(p, "#DDDDDD"), line=dict(color="white", width=1)),
            hovertemplate=f"%{{y}}<br>{p}: %{{x:.2f}} ms per {per}<extra></extra>",
            meta={"role": "phase", "key": p}))
    ann = []
    for m, name in zip(methods, names_y):
        tot = sum(data[m][0].get(p, 0.0) for p in phases + others) / denom(m)
        extra = f" · {1000 / tot:.1f} tok/s" if per == "token" and tot > 0 else ""
        ann.append(dict(y=name, x=tot, xanchor="left", xshift=6, showarrow=False, text=f"<b>{tot:.1f} ms</b>{extra}",
                        font=dict(size=12)))
    names = [t.name for t in fig.data]
    sub = (f"Milliseconds per generated {per}, stacked by phase; "
           + ("fewer forward passes per token is where speculative decoding wins"))
    h = height or (170 + 56 * len(methods) + 24 * C.legend_rows(names, width))
    fig.update_layout(**C.base_layout(title, sub, legend_names=names, width=width, height=h, barmode="stack",
                                      annotations=ann, bargap=0.35, margin=dict(l=150, r=150, t=110, b=50)))
    fig.update_xaxes(title=f"ms per {per}", rangemode="tozero")
    fig.update_yaxes(autorange="reversed")
    return fig
