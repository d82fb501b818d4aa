"""Stage 5 of a step's anatomy: how one forward pass checks a whole tree (tree attention).

A mask matrix. Rows: the draft tree's nodes, each labelled with its token and its position id
(the text's length + its depth, so siblings share a position). Columns: one folded column for
the earlier text, the text's last tokens, then the tree's nodes. A filled cell: the row may
look at the column; a blank one: blocked. Every row sees all of the text; inside the tree it
sees only itself and its ancestors, so each branch is read as if it were the only
continuation, and the whole tree costs one pass.

The rows are listed depth-first with the tree drawn as an outline beside them, each node on
its own row under its parent, so the filled tree cells of a row sit exactly under the nodes on
its outline path. (The model is fed the nodes breadth-first; the order changes nothing, only
the mask does. The tidy tree layout of the other figures cannot put one node per row.)
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import plotly.graph_objects as go

from . import colors as C
from . import stage_common as S
from .tokens import esc, esc_hover, token_label, truncate

_INDENT = 12.0     # px per outline level
_MAX_CELL = 22.0
_MIN_ROW = 17.0
_HEADER_H = 80.0   # rotated column headers
_GROUP_H = 20.0
_FONT = 11


def dfs_order(parents: Sequence[int]) -> list[int]:
    """Nodes depth-first (pre-order), children in index order: each node right after its
    parent's earlier subtrees, so an outline of it has no crossing connectors."""
    kids: list[list[int]] = [[] for _ in parents]
    roots = []
    for i, p in enumerate(parents):
        (kids[p] if p is not None and p >= 0 else roots).append(i)
    out, stack = [], list(reversed(roots))
    while stack:
        v = stack.pop()
        out.append(v)
        stack.extend(reversed(kids[v]))
    return out


def outline_levels(parents: Sequence[int], order: Sequence[int]) -> list[int]:
    """Indent level per node: an only child continues under its parent at the same level (long
    chains stay narrow); siblings step one level in."""
    n_kids = [0] * len(parents)
    for p in parents:
        if p is not None and p >= 0:
            n_kids[p] += 1
    level = [0] * len(parents)
    for v in order:
        p = parents[v]
        if p is not None and p >= 0:
            level[v] = level[p] + (1 if n_kids[p] > 1 else 0)
    return level


def attention_mask_figure(attention: dict[str, Any], decode_one: Callable[[int], str], *,
                          accepted: Sequence[int] | None = None, width: int = 860,
                          title: str | None = None) -> go.Figure:
    """Stage 5 (`anatomy["attention"]`): the tree-attention mask beside an outline of the tree.

    `accepted`: tree node indices of the accepted path, framed. The heatmap trace's `z` is the
    mask as drawn (0 = blocked); `layout.meta` gives the row order (tree node per row) and
    what each column is."""
    title = title or "5 · One forward pass for the whole tree: who may look at whom"
    tree = attention["tree"]
    toks = [int(t) for t in tree["tokens"]]
    parents = list(tree["parents"])
    sources = list(tree.get("sources") or ["root"] + ["logits"] * (len(toks) - 1))
    anc = attention["ancestors"]
    past = int(attention["past"])
    tail = [int(t) for t in attention.get("tail") or []]
    positions = list(attention.get("positions") or [past + d for d in tree["depths"]])
    T = len(toks)
    acc = set(accepted or [])
    order = dfs_order(parents)
    row_of = {v: r for r, v in enumerate(order)}
    level = outline_levels(parents, order)

    margin = dict(l=10, r=10, b=12)
    plot_w = width - margin["l"] - margin["r"]

    # Row labels: the outline plus "‘tok’ · pos p", within about 40 % of the width.
    max_level = max(level)
    room = 0.42 * plot_w - max_level * _INDENT - 14
    adv = C.MONO_ADVANCE * _FONT
    for fmt in ("{tok} · pos {p}", "{tok} · {p}"):
        fixed = len(fmt.format(tok="‘’", p=max(positions)))
        max_cells = int(room / adv) - fixed
        if max_cells >= 4:
            break
    max_cells = max(3, min(12, max_cells))
    labels = [fmt.format(tok="‘" + truncate(token_label(decode_one, t), max_cells) + "’", p=positions[i])
              for i, t in enumerate(toks)]
    label_w = max(level[i] * _INDENT + 14 + len(labels[i]) * adv for i in range(T)) + 8

    # Columns: the folded earlier text, as much of the tail as fits, then the tree.
    mask_w = plot_w - label_w - 4          # room for the frame of an accepted row
    shown_tail = len(tail)
    while shown_tail > 1 and mask_w / (1 + shown_tail + T) < 12:
        shown_tail -= 1
    tail_cols = tail[len(tail) - shown_tail:]
    earlier = past - len(tail_cols)
    cols: list[dict[str, Any]] = []
    if earlier > 0:
        cols.append({"kind": "earlier", "count": earlier})
    cols += [{"kind": "context", "token": t, "pos": past - len(tail_cols) + k} for k, t in enumerate(tail_cols)]
    cols += [{"kind": "tree", "node": v, "token": toks[v]} for v in order]
    n_cols = len(cols)
    cw = min(_MAX_CELL, mask_w / n_cols)
    rh = max(cw, _MIN_ROW)
    headers = cw >= 11
    head_h = (_HEADER_H if headers else 0.0) + _GROUP_H
    x_mask = label_w
    y_top = -head_h                                  # first row's top edge (y grows upwards)

    def cx(c: int) -> float:
        return x_mask + (c + 0.5) * cw

    def cy(r: int) -> float:
        return y_top - (r + 0.5) * rh

    # The mask: categories 0 blocked, 1 text, 2.. the source of the column's tree node.
    cats = ["blocked", "text"] + sorted({sources[v] for v in order}, key=lambda s: list(C.SOURCE_COLORS).index(s)
                                        if s in C.SOURCE_COLORS else 99)
    code = {s: k for k, s in enumerate(cats)}
    z, hover = [], []
    for r, v in enumerate(order):
        zr, hr = [], []
        who = f"row ‘{esc_hover(token_label(decode_one, toks[v]))}’ (pos {positions[v]})"
        for col in cols:
            if col["kind"] != "tree":
                zr.append(1)
                what = (f"the {col['count']} earlier tokens" if col["kind"] == "earlier" else
                        f"‘{esc_hover(token_label(decode_one, col['token']))}’ (pos {col['pos']}, the text)")
                hr.append(f"{who}<br>sees {what}: all of the text is visible")
            else:
                u = col["node"]
                sees = bool(anc[v][u])
                zr.append(code[sources[u]] if sees else 0)
                tok = esc_hover(token_label(decode_one, toks[u]))
                hr.append(f"{who}<br>{'sees' if sees else 'blocked from'} ‘{tok}’ (pos {positions[u]}): "
                          + ("itself" if u == v else "its ancestor" if sees else "not on its path"))
        z.append(zr)
        hover.append(hr)
    n_cat = len(cats)
    scale = []
    for k, s in enumerate(cats):
        color = (C.tint(C.REJECTED_COLOR, 0.22) if s == "blocked" else C.tint(C.SOURCE_COLORS["root"], 0.45)
                 if s == "text" else C.source_color(s))
        scale += [[k / n_cat, color], [(k + 1) / n_cat, color]]
    fig = C.TraceList()
    gap = 1.5 if cw >= 8 else 0.6
    fig.add_trace(go.Heatmap(z=z, x=[cx(c) for c in range(n_cols)], y=[cy(r) for r in range(T)],
                             zmin=-0.5, zmax=n_cat - 0.5, colorscale=scale, showscale=False, xgap=gap, ygap=gap,
                             hovertext=hover, hovertemplate="%{hovertext}<extra></extra>",
                             meta={"role": "mask", "categories": cats}))

    shapes, ann = [], []
    # The outline: connectors, then a small square in the source colour and the label per row.
    ex, ey, ax, ay = [], [], [], []
    for v in order:
        p = parents[v]
        if p is None or p < 0:
            continue
        xp = level[p] * _INDENT + 5
        xv = level[v] * _INDENT + 5
        on_path = v in acc and p in acc
        xs, ys = (ax, ay) if on_path else (ex, ey)
        if level[v] == level[p]:
            xs += [xp, xp, None]
            ys += [cy(row_of[p]) - 5, cy(row_of[v]) + 5, None]
        else:
            xs += [xp, xp, xv - 5, None]
            ys += [cy(row_of[p]) - 5, cy(row_of[v]), cy(row_of[v]), None]
    fig.add_trace(go.Scatter(x=ex, y=ey, mode="lines", hoverinfo="skip", showlegend=False,
                             line=dict(color=C.TRIE_EDGE_COLOR, width=1.3), meta={"role": "outline"}))
    fig.add_trace(go.Scatter(x=ax, y=ay, mode="lines", hoverinfo="skip", showlegend=False,
                             line=dict(color=C.ACCEPTED_COLOR, width=2.6), meta={"role": "outline_accepted"}))
    fig.add_trace(go.Scatter(x=[level[v] * _INDENT + 5 for v in order], y=[cy(r) for r in range(T)], mode="markers",
                             hoverinfo="skip", showlegend=False,
                             marker=dict(symbol="square", size=9, color=[C.source_color(sources[v]) for v in order],
                                         line=dict(color=[C.ACCEPTED_COLOR if v in acc else "#FFFFFF" for v in order],
                                                   width=1.5)),
                             meta={"role": "outline_nodes"}))
    for r, v in enumerate(order):
        text = esc(labels[v])
        ann.append(dict(x=level[v] * _INDENT + 13, y=cy(r), xref="x", yref="y", xanchor="left", yanchor="middle",
                        showarrow=False, text=f"<b>{text}</b>" if v in acc else text,
                        font=dict(family=C.MONO_FONT, size=_FONT,
                                  color="#222222" if v in acc or not acc else "#555555")))
        if v in acc:
            shapes.append(dict(type="rect", xref="x", yref="y", x0=x_mask - 2, x1=x_mask + n_cols * cw + 2,
                               y0=cy(r) - rh / 2 - 0.5, y1=cy(r) + rh / 2 + 0.5, fillcolor="rgba(0,0,0,0)",
                               line=dict(color=C.ACCEPTED_COLOR, width=2), layer="above", name=f"accepted row {r}"))

    # Column headers (rotated) and the two groups: the text, the draft tree.
    n_text = n_cols - T
    if headers:
        head_font = 10 if cw < 16 else _FONT
        cells_up = max(3, int((_HEADER_H - 8) / (C.MONO_ADVANCE * head_font)))
        for c, col in enumerate(cols):
            if col["kind"] == "earlier":
                text = truncate(f"…{col['count']} before", cells_up)
            else:
                text = truncate(token_label(decode_one, col["token"]), cells_up)
            ann.append(dict(x=cx(c), y=y_top + 4, xref="x", yref="y", xanchor="center", yanchor="bottom",
                            textangle=-90, showarrow=False, text=esc(text),
                            font=dict(family=C.MONO_FONT, size=head_font,
                                      color="#222222" if col["kind"] == "tree" else "#555555")))
    y_group = y_top + (_HEADER_H if headers else 0.0) + 4
    # Group names meet at the line between text and tree: the text's reaches left over the
    # (empty) space above the row labels, the tree's right.
    for lo, hi, text in ((0, n_text, "the text so far →"), (n_text, n_cols, "← the draft tree")):
        if hi <= lo:
            continue
        x0, x1 = x_mask + lo * cw + 1, x_mask + hi * cw - 1
        shapes.append(dict(type="line", xref="x", yref="y", x0=x0, x1=x1, y0=y_group, y1=y_group,
                           line=dict(color="#555555", width=1.2)))
        ann.append(dict(x=x1 if lo == 0 else x0, y=y_group + 1, xref="x", yref="y",
                        xanchor="right" if lo == 0 else "left", yanchor="bottom", showarrow=False,
                        text=text, font=dict(size=11, color="#333333")))
    shapes.append(dict(type="line", xref="x", yref="y", x0=x_mask + n_text * cw, x1=x_mask + n_text * cw,
                       y0=y_group, y1=cy(T - 1) - rh / 2, line=dict(color="#555555", width=1.2)))

    for t in (S.legend_key("sees (a filled cell)", "sees", color=C.tint(C.SOURCE_COLORS["root"], 0.45)),
              S.legend_key("blocked", "blocked", color=C.tint(C.REJECTED_COLOR, 0.22))):
        fig.add_trace(t)
    for t in S.source_legend(sources):
        fig.add_trace(t)
    if acc:
        fig.add_trace(S.legend_key("accepted path", "accepted", color=C.ACCEPTED_COLOR, mode="lines", line_width=2.6))

    sub = (f"The model reads all {T} draft tokens at once. Each row is one of them; a filled cell means it may "
           "look at that column. Every row sees all of the text, but in the tree only itself and its "
           "ancestors, so each branch reads as if it were the only continuation. Position = "
           f"text length ({past}) + depth: siblings share one.")
    bottom = cy(T - 1) - rh / 2 - 6
    meta = {"rows": list(order), "columns": cols, "accepted": sorted(acc), "cell_w": cw, "row_h": rh,
            "tail_shown": len(tail_cols)}
    return S.frame(fig, title, sub, width=width, plot_h=-bottom + 4, margin=margin,
                   x_range=(0.0, plot_w), y_range=(bottom, 4.0), meta=meta, shapes=shapes, annotations=ann)
