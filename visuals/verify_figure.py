"""Stage 6 of a step's anatomy: the check, and where the model stopped agreeing.

The verified tree with, in every box, the model's own next token there ("model: ‘…’"), read
from the single forward pass. Walking down from x0, a child is accepted exactly when its token
is what the model wants at its parent; the accepted path is drawn thick and dark. At the stop
a marker says why it stopped:

* mismatch: "model wants ‘X’ — no child carries it" (‘X’ comes free: it is the next x0);
* leaf: "the tree ends here" (the model's next token still comes free as the next x0);
* limit / end: "the run ended here" (end of text or the token limit).

The stop is a box of its own, hanging off the last accepted node by a dotted edge, so the tidy
layout keeps it clear of the other boxes at every width.
"""
from __future__ import annotations

from typing import Any, Callable

import plotly.graph_objects as go

from . import colors as C
from . import stage_common as S
from .tokens import cells, esc, esc_hover, token_label, truncate
from .tree_figure import _BORDER, _PAD, _edge_path, edge_lines, tree_layout


def _model_tokens(verify: dict[str, Any], n: int) -> list[int | None]:
    """The model's token after every node: its choice on the accepted path, else its top token."""
    top = verify.get("model_top")
    out: list[int | None] = [int(top[i]) if top is not None and i < len(top) and top[i] is not None else None
                             for i in range(n)]
    for k, v in (verify.get("chosen") or {}).items():
        if 0 <= int(k) < n and v is not None:
            out[int(k)] = int(v)
    return out


def stop_lines(verify: dict[str, Any], decode: Callable[[int], str], max_cells: int = 12) -> tuple[str, str | None]:
    """Why the accepted path stopped where it did, in plain words (two short lines, unescaped)."""
    reason = verify.get("reason")
    wanted = verify.get("wanted")
    tok = "‘" + truncate(token_label(decode, wanted), max_cells) + "’" if wanted is not None else None
    if reason == "mismatch":
        return (f"model wants {tok}" if tok else "the model wants another token"), "no child carries it"
    if reason == "leaf":
        return "the tree ends here", (f"model: {tok} comes next" if tok else None)
    return "the run ended here", None


def verify_figure(verify: dict[str, Any], decode_one: Callable[[int], str], *, tree: dict[str, Any],
                  width: int = 860, title: str | None = None) -> go.Figure:
    """Stage 6 (`anatomy["verify"]`) on the step's tree (`anatomy["attention"]["tree"]`, the
    step record's tree): every node with the model's token there, the accepted path thick and
    dark, and a stop box hanging off the last accepted node that says why it stopped.
    `layout.meta["stop"]` is the last accepted node, `["reason"]` why."""
    title = title or "6 · The check: where the model stops agreeing"
    toks = [int(t) for t in tree["tokens"]]
    n = len(toks)
    parents = list(tree["parents"])
    sources = list(tree.get("sources") or ["root"] + ["logits"] * (n - 1))
    depths = list(tree.get("depths") or [])
    if len(depths) != n:
        depths = []
        for p in parents:
            depths.append(0 if p < 0 else depths[p] + 1)
    path = [i for i in verify.get("accepted") or [0] if 0 <= i < n] or [0]
    last = int(verify.get("last", path[-1]))
    reason = verify.get("reason")
    wanted = verify.get("wanted")
    model = _model_tokens(verify, n)
    stop1, stop2 = stop_lines(verify, decode_one)
    # The stop is one more box in the layout, a child of the last accepted node, so the tidy
    # layout keeps it clear of every other box.
    texts = [token_label(decode_one, t) for t in toks] + [stop1]
    sub_of: list[str | None] = [None if m is None else token_label(decode_one, m) for m in model] + [stop2]

    def second_line(i: int, lab: str) -> str | None:
        s = sub_of[i]
        if s is None or i == n:
            return s
        return "model: ‘" + truncate(s, max(7, cells(lab))) + "’"

    def box(i: int, lab: str, font: int) -> tuple[float, float]:
        sf = font - 2
        first = stop1 if i == n else lab
        second = second_line(i, lab)
        w = max(cells(first) * font, (cells(second) if second else 0) * sf) * C.MONO_ADVANCE + 2 * (_PAD + _BORDER) + 2
        h = font * 1.3 + (sf * 1.3 if second else 0) + 2 * (_PAD + _BORDER)
        return w, h

    margin = dict(l=12, r=12, b=12)
    lay = tree_layout(toks + [-1], parents + [last], depths + [depths[last] + 1], path + [n], decode_one,
                      width=width, margin_lr=margin["l"] + margin["r"], texts=texts, box=box, min_pitch=58.0)
    acc = set(path)
    acc_edges = {(path[k - 1], path[k]) for k in range(1, len(path))}
    fig = C.TraceList()
    ex, ey, ax, ay = edge_lines(lay, parents, acc_edges)
    fig.add_trace(go.Scatter(x=ex, y=ey, mode="lines", showlegend=False, hoverinfo="skip",
                             line=dict(color=C.REJECTED_COLOR, width=C.REJECTED_WIDTH),
                             meta={"role": "rejected_edges"}))
    fig.add_trace(go.Scatter(x=ax, y=ay, mode="lines", showlegend=False, hoverinfo="skip",
                             line=dict(color=C.ACCEPTED_COLOR, width=C.ACCEPTED_WIDTH),
                             meta={"role": "accepted_edges"}))
    xs, ys = _edge_path(lay, last, n)
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", showlegend=False, hoverinfo="skip",
                             line=dict(color=C.ACCEPTED_COLOR, width=1.6, dash="dot"), meta={"role": "stop_edge"}))

    ann, shapes, hover = [], [], []
    for i in range(len(lay.labels)):
        lab = lay.labels[i]
        if i == n:
            bg, border, fc, bold = "#FFFFFF", C.ACCEPTED_COLOR, "#111111", True
            lab = stop1
        else:
            col = C.source_color(sources[i])
            if i in acc:
                bg, border, fc, bold = col, C.ACCEPTED_COLOR, C.text_color_on(col), True
            else:
                bg, border, fc, bold = C.tint(col, 0.22), C.tint(col, 0.75), "#4D4D4D", False
        if lab is not None:
            text = f"<b>{esc(lab)}</b>" if bold else esc(lab)
            second = second_line(i, lab)
            if second:
                text += f"<br><span style='font-size:{lay.font_size - 2}px'>{esc(second)}</span>"
            ann.append(dict(x=lay.cx[i], y=lay.cy[i], xref="x", yref="y", showarrow=False, text=text,
                            font=dict(family=C.MONO_FONT, size=lay.font_size, color=fc), bgcolor=bg,
                            bordercolor=border, borderwidth=_BORDER, borderpad=_PAD, xanchor="center",
                            yanchor="middle", captureevents=False))
        if i < n:
            m = model[i]
            agree = ""
            if parents[i] >= 0 and model[parents[i]] is not None:
                agree = ("<br>its token is what the model wants at its parent: accepted" if i in acc else
                         "<br>the model wants another token at its parent" if model[parents[i]] != toks[i] else
                         "<br>matches the model, but its parent was not accepted")
            src = C.SOURCE_NAMES.get(sources[i], sources[i])
            hover.append(f"<b>{esc_hover(lay.full[i])}</b><br>token id: {toks[i]} · {src}"
                         + (f"<br>the model's next token here: ‘{esc_hover(token_label(decode_one, m))}’ (id {m})"
                            if m is not None else "") + agree + f"<extra>node {i}</extra>")
        else:
            hover.append(f"<b>{esc_hover(stop1)}</b>" + (f"<br>{esc_hover(stop2)}" if stop2 else "")
                         + (f"<br>the model's own token here (id {wanted}) comes free:<br>it is the next step's x0"
                            if wanted is not None and reason in ("mismatch", "leaf") else "")
                         + "<extra>stop</extra>")
    fig.add_trace(go.Scatter(x=lay.cx, y=lay.cy, mode="markers", showlegend=False, hovertemplate=hover,
                             marker=dict(size=[max(w, h) if lay.labels[i] is not None else 10
                                               for i, (w, h) in enumerate(zip(lay.w, lay.h))],
                                         symbol="square" if not lay.compact else "circle",
                                         color=[C.source_color(sources[i]) if i < n else "#FFFFFF"
                                                for i in range(len(lay.cx))],
                                         opacity=[0.0 if lay.labels[i] is not None else (1.0 if i in acc else 0.45)
                                                  for i in range(len(lay.cx))], line=dict(width=0)),
                             meta={"role": "nodes"}))

    # The stop: a dotted ring around the last accepted node (the stop box hangs off it).
    pad = 5.0
    shapes.append(dict(type="rect", xref="x", yref="y", x0=lay.cx[last] - lay.w[last] / 2 - pad,
                       x1=lay.cx[last] + lay.w[last] / 2 + pad, y0=lay.cy[last] - lay.h[last] / 2 - pad,
                       y1=lay.cy[last] + lay.h[last] / 2 + pad, line=dict(color=C.ACCEPTED_COLOR, width=2, dash="dot"),
                       fillcolor="rgba(0,0,0,0)", layer="above", name="stop"))
    x_lo, x_hi = lay.x_range
    y_lo, y_hi = lay.y_range

    for t in S.source_legend(sources):
        fig.add_trace(t)
    fig.add_trace(S.legend_key("accepted path", "accepted", color=C.ACCEPTED_COLOR, mode="lines", line_width=4))
    n_acc = len(path) - 1
    committed = len(verify.get("committed") or path)
    sub = ("One pass of the model gives its own next token at every node (\"model: ‘…’\"). From x0 down, a child "
           "is accepted when it is exactly the token the model wants at its parent. "
           f"Accepted: {n_acc} draft token{'s' if n_acc != 1 else ''}; with x0, {committed} token"
           f"{'s' if committed != 1 else ''} committed this step.")
    if reason in ("mismatch", "leaf") and wanted is not None:
        sub += " The model's own token at the stop comes free: it is the next step's x0."
    if not verify.get("greedy", True):
        sub += " (Sampling: \"model\" is the token it drew.)"
    if lay.compact:
        sub += " Only the accepted path is labelled at this size: hover a dot."
    return S.frame(fig, title, sub, width=width, plot_h=y_hi - y_lo, margin=margin, x_range=(x_lo, x_hi),
                   y_range=(y_lo, y_hi), meta={"stop": last, "reason": reason, "wanted": wanted, "accepted": path,
                                               "orientation": lay.orientation, "compact": lay.compact},
                   shapes=shapes, annotations=ann)
