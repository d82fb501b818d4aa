"""Figure 1: the draft tree of one step.

Every candidate token is a box coloured by where it came from (retrieval, logits, both, and
prompt lookup or Token Recycling's template where the drafter adds them; the legend lists every
source the step's drafter can add, see `colors.legend_sources`); the path the model agreed
with is drawn thick and dark, the rejected branches are faded, and the
token the model fixed after the last accepted node (the next step's root) hangs off the end as
a dotted "next" box. Labels show token text with whitespace made visible; hover shows the
rest (token id, source, rank, depth, breadth, retrieval frequency, accepted or not).

Layout: a tidy tree (`visuals.layout`) computed in screen pixels, so label boxes can be
checked for collisions (`label_boxes`) before anything is drawn. Top-down when all labels fit
the width at a readable size, else left-to-right (tokens then read like text along the
accepted path). Above `max_label_nodes` nodes only the accepted path is labelled; the other
nodes are dots with hover.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import plotly.graph_objects as go

from . import colors as C
from ._data import get, info_of, tree_fields
from .layout import tidy_positions
from .tokens import cells, esc, esc_hover, token_label, truncate

#: Label-fitting attempts, most readable first: (font size px, max label cells).
_FITS = ((12, 12), (12, 10), (12, 8), (11, 8), (11, 7), (11, 6), (10, 6), (10, 5), (10, 4), (10, 3))
_PAD = 2.0        # annotation borderpad
_BORDER = 2.0     # annotation borderwidth (all boxes; keeps sizes uniform)
_GAP_TB = 8.0     # px between boxes of one depth, top-down
_GAP_LR = 4.0     # px between rows, left-to-right
_COLGAP_LR = 26.0  # px between depth columns, left-to-right
_DOT = 10.0       # dot size in compact mode


@dataclass
class TreeLayout:
    """Node boxes in plot pixels (y up). Index `n` (== len(tree)) is the "next root" box if any."""
    orientation: str                 # "tb" (top-down) or "lr" (left-to-right)
    compact: bool                    # True: only the accepted path is labelled
    font_size: int
    max_cells: int
    labels: list[str | None]         # shown text (unescaped) or None for a dot
    full: list[str]                  # full visible token text
    parents: list[int]
    depths: list[int]
    cx: list[float] = field(default_factory=list)
    cy: list[float] = field(default_factory=list)
    w: list[float] = field(default_factory=list)
    h: list[float] = field(default_factory=list)
    plot_w: float = 0.0
    plot_h: float = 0.0
    x_range: tuple[float, float] = (0.0, 1.0)
    y_range: tuple[float, float] = (0.0, 1.0)
    has_next: bool = False


def box_size(text: str, font: int) -> tuple[float, float]:
    """Estimated pixel size of an annotation box holding `text` in the monospace font."""
    return (cells(text) * C.MONO_ADVANCE * font + 2 * (_PAD + _BORDER) + 2,
            font * 1.3 + 2 * (_PAD + _BORDER))


def label_boxes(layout: TreeLayout) -> list[tuple[float, float, float, float]]:
    """(x0, y0, x1, y1) pixel boxes of every labelled node (for collision checks)."""
    return [(x - w / 2, y - h / 2, x + w / 2, y + h / 2)
            for x, y, w, h, lab in zip(layout.cx, layout.cy, layout.w, layout.h, layout.labels)
            if lab is not None]


def tree_layout(tokens: list[int], parents: list[int], depths: list[int], accepted: list[int],
                decode: Callable[[int], str] = str, *, next_root: int | None = None,
                width: int = 900, margin_lr: float = 40.0, orientation: str = "auto",
                max_label_nodes: int = 64, texts: list[str] | None = None,
                labelled: Iterable[int] | None = None,
                box: Callable[[int, str, int], tuple[float, float]] | None = None,
                min_pitch: float = 44.0) -> TreeLayout:
    """Place the tree's boxes in pixels for a figure `width` px wide (see module doc).

    `texts` overrides the visible node texts (default: `decode` of each token). `labelled`:
    the nodes that keep a label when the tree is too big to label every node (default: the
    accepted path and the next root). `box(i, label, font)`: the pixel size of node i's box
    holding `label` (default `box_size`), for callers that put more than the label in a box.
    `min_pitch`: the least distance between depths, top-down (taller boxes need more)."""
    n = len(tokens)
    parents, depths = list(parents), list(depths)
    full = list(texts) if texts is not None else [token_label(decode, t) for t in tokens]
    if next_root is not None and accepted:
        parents.append(accepted[-1])
        depths.append(depths[accepted[-1]] + 1)
        full.append(token_label(decode, next_root))
    m = len(full)
    avail = width - margin_lr
    acc = set(accepted) | ({n} if m > n else set())
    shown = acc if labelled is None else set(labelled)
    compact = n > max_label_nodes
    size_of = box or (lambda i, lab, font: box_size(lab, font))

    def attempt(orient: str, font: int, maxc: int, gap_tb: float = _GAP_TB) -> TreeLayout | None:
        labels = [truncate(full[i], maxc) if (not compact or i in shown) else None for i in range(m)]
        sizes = [size_of(i, lab, font) if lab is not None else (_DOT, _DOT) for i, lab in enumerate(labels)]
        lay = TreeLayout(orient, compact, font, maxc, labels, full, parents, depths, has_next=m > n)
        lay.w = [s[0] for s in sizes]
        lay.h = [s[1] for s in sizes]
        row_h = box_size("x", font)[1]
        if orient == "tb":
            b = tidy_positions(parents, lay.w, gap_tb if not compact else 3.0)
            extent = max(b[i] + lay.w[i] / 2 for i in range(m)) - min(b[i] - lay.w[i] / 2 for i in range(m))
            if extent > avail and not compact:
                return None
            scale = min(1.0, avail / extent) if extent > 0 else 1.0
            maxd = max(depths)
            pitch = max(min_pitch, min(66.0, 640.0 / max(1, maxd)))
            lay.cx = [x * scale for x in b]
            lay.cy = [-d * pitch for d in depths]
        else:
            gap = _GAP_LR if not compact else 2.0
            b = tidy_positions(parents, lay.h, gap)
            maxd = max(depths)
            colw = [0.0] * (maxd + 1)
            for i in range(m):
                colw[depths[i]] = max(colw[depths[i]], lay.w[i])
            total = sum(colw) + _COLGAP_LR * maxd
            if total > avail:
                if not compact:
                    return None
            left = [0.0] * (maxd + 1)
            for d in range(1, maxd + 1):
                left[d] = left[d - 1] + colw[d - 1] + _COLGAP_LR
            scale_x = min(1.0, avail / total) if compact and total > 0 else 1.0
            # boxes are left-aligned in their depth column, so the text of a path reads on
            lay.cx = [(left[depths[i]] + lay.w[i] / 2) * scale_x for i in range(m)]
            extent = max(b) - min(b) + row_h
            scale_y = min(1.0, 1400.0 / extent) if compact else 1.0
            lay.cy = [-y * scale_y for y in b]
        _frame(lay, avail)
        return lay

    orients = ("tb", "lr") if orientation == "auto" else (orientation,)
    if compact:
        return attempt(orients[-1] if orientation == "auto" else orientation, 12, 12)
    for orient in orients:
        fits = _FITS
        if orientation == "auto" and orient == "tb":
            fits = tuple(f for f in _FITS if f[1] >= 6 and f[0] >= 11)   # top-down only if readable
        if orient == "tb":   # small trees: roomier and larger first
            for font, gap in ((14, 24.0), (13, 16.0)):
                lay = attempt(orient, font, 12, gap)
                if lay is not None:
                    return lay
        for font, maxc in fits:
            lay = attempt(orient, font, maxc)
            if lay is not None:
                return lay
    # nothing fits: label the accepted path only
    compact = True
    return attempt(orients[-1], 12, 12)


def _frame(lay: TreeLayout, avail: float) -> None:
    x0 = min(x - w / 2 for x, w in zip(lay.cx, lay.w))
    x1 = max(x + w / 2 for x, w in zip(lay.cx, lay.w))
    y0 = min(y - h / 2 for y, h in zip(lay.cy, lay.h))
    y1 = max(y + h / 2 for y, h in zip(lay.cy, lay.h))
    mid = (x0 + x1) / 2
    lay.plot_w = avail
    lay.x_range = (mid - avail / 2, mid + avail / 2)
    lay.plot_h = (y1 - y0) + 16
    lay.y_range = (y0 - 8, y1 + 8)


def _edge_path(lay: TreeLayout, p: int, c: int) -> tuple[list[float], list[float]]:
    """Elbow connector from box p to box c (org-chart style: no crossings in a tidy layout)."""
    if lay.orientation == "tb":
        ys = lay.cy[p] - lay.h[p] / 2
        ye = lay.cy[c] + lay.h[c] / 2
        ym = (ys + ye) / 2
        return [lay.cx[p], lay.cx[p], lay.cx[c], lay.cx[c], None], [ys, ym, ym, ye, None]
    xs = lay.cx[p] + lay.w[p] / 2
    xe = lay.cx[c] - lay.w[c] / 2
    xm = xe - _COLGAP_LR / 2 if not lay.compact else (xs + xe) / 2
    xm = max(xm, xs)
    return [xs, xm, xm, xe, None], [lay.cy[p], lay.cy[p], lay.cy[c], lay.cy[c], None]


def edge_lines(lay: TreeLayout, parents: list[int], accepted_edges: set[tuple[int, int]]
               ) -> tuple[list[float], list[float], list[float], list[float]]:
    """Polylines (x, y with None breaks) of the tree's edges: the rejected ones, then the
    accepted path's (`accepted_edges`: (parent, child) pairs)."""
    ex: list[float] = []
    ey: list[float] = []
    ax: list[float] = []
    ay: list[float] = []
    for c in range(1, len(parents)):
        p = parents[c]
        if p < 0:
            continue
        xs, ys = _edge_path(lay, p, c)
        if (p, c) in accepted_edges:
            ax += xs
            ay += ys
        else:
            ex += xs
            ey += ys
    return ex, ey, ax, ay


def _fmt(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


def draft_tree_figure(step: Any, decode: Callable[[int], str] = str, *, width: int = 900,
                      orientation: str = "auto", max_label_nodes: int = 64,
                      title: str | None = None) -> go.Figure:
    """The draft tree of one step (a `StepRecord` or its dict) as a plotly figure.

    `decode` maps a token id to its text. `orientation`: "auto" (top-down if every label fits
    `width` at a readable size, else left-to-right), "tb" or "lr". Trees larger than
    `max_label_nodes` label only the accepted path. The figure's `layout.meta` holds the
    pixel `label_boxes` and the orientation, for tests and for the app.
    """
    tree = get(step, "tree")
    f = tree_fields(tree)
    n = len(f["tokens"])
    accepted = [a for a in (get(step, "accepted", None) or [0]) if 0 <= a < n]
    forwarded = get(step, "forwarded", True)
    next_root = get(step, "next_root", None) if forwarded and n > 0 else None
    margin = dict(l=20, r=20, t=120, b=20)
    lay = tree_layout(f["tokens"], f["parents"], f["depths"], accepted, decode, next_root=next_root,
                      width=width, margin_lr=margin["l"] + margin["r"], orientation=orientation,
                      max_label_nodes=max_label_nodes)
    acc = set(accepted)
    acc_edges = {(accepted[i - 1], accepted[i]) for i in range(1, len(accepted))}
    fig = C.TraceList()

    # edges: rejected first (underneath), then the accepted path, then the "next root" link
    ex, ey, ax, ay = edge_lines(lay, f["parents"], acc_edges)
    fig.add_trace(go.Scatter(x=ex, y=ey, mode="lines", name="rejected branch", showlegend=False,
                             line=dict(color=C.REJECTED_COLOR, width=C.REJECTED_WIDTH), hoverinfo="skip",
                             meta={"role": "rejected_edges"}))
    fig.add_trace(go.Scatter(x=ax, y=ay, mode="lines", name="accepted path", showlegend=False,
                             line=dict(color=C.ACCEPTED_COLOR, width=C.ACCEPTED_WIDTH), hoverinfo="skip",
                             meta={"role": "accepted_edges", "segments": len(acc_edges)}))
    if lay.has_next:
        xs, ys = _edge_path(lay, accepted[-1], n)
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", showlegend=False, hoverinfo="skip",
                                 line=dict(color=C.SOURCE_COLORS["root"], width=2, dash="dot"),
                                 meta={"role": "next_edge"}))

    # hover targets (and the visible dots in compact mode)
    hover, colors, opac, sizes = [], [], [], []
    for i in range(n):
        meta = f["meta"][i]
        src = f["sources"][i]
        status = "accepted" if i in acc else "rejected"
        if i == 0:
            status = "root (fixed by the model last step)"
        hover.append(
            f"<b>{esc_hover(lay.full[i])}</b><br>token id: {f['tokens'][i]}<br>source: {C.SOURCE_NAMES.get(src, src)}"
            f"<br>rank: {f['ranks'][i]}<br>depth: {f['depths'][i]}"
            f"<br>breadth: {_fmt(meta.get('breadth'))}<br>retrieval freq: {_fmt(meta.get('freq'))}"
            + (f"<br>border depth: {meta['border_depth']}" if meta.get("border_depth") is not None else "")
            + (f"<br>lookup match agrees {meta['run']} tokens back" if meta.get("run") else "")
            + (f"<br>probability in its copy-logit row: {meta['p_row']:.2f}"
               if isinstance(meta.get("p_row"), (int, float)) and meta["p_row"] >= 0 else "")
            + (f"<br>estimated P(accept): {meta['p_accept']:.2f}" if isinstance(meta.get("p_accept"), (int, float)) else "")
            + f"<br>{status}<extra>node {i}</extra>")
        colors.append(C.source_color(src))
        opac.append(1.0 if i in acc else 0.45)
        sizes.append(max(lay.w[i], lay.h[i]) if lay.labels[i] is not None else _DOT)
    fig.add_trace(go.Scatter(
        x=lay.cx[:n], y=lay.cy[:n], mode="markers", name="nodes", showlegend=False,
        hovertemplate=hover, hoverlabel=dict(font=dict(family=C.MONO_FONT)),
        marker=dict(color=colors, size=sizes, symbol="square" if not lay.compact else "circle",
                    opacity=[0.0 if lay.labels[i] is not None else opac[i] for i in range(n)],
                    line=dict(width=0)),
        meta={"role": "nodes", "sources": list(f["sources"]), "accepted": sorted(acc)}))
    if lay.has_next:
        fig.add_trace(go.Scatter(
            x=[lay.cx[n]], y=[lay.cy[n]], mode="markers", showlegend=False,
            marker=dict(size=max(lay.w[n], lay.h[n]), color="rgba(0,0,0,0)", symbol="square"),
            hovertemplate=(f"<b>{esc_hover(lay.full[n])}</b><br>token id: {next_root}<br>next root: the model's own "
                           "token after the last accepted node;<br>it starts the next step<extra></extra>"),
            meta={"role": "next_root"}))

    # label boxes
    annotations = []
    for i in range(len(lay.labels)):
        lab = lay.labels[i]
        if lab is None:
            continue
        if i == n:   # next root
            bg, border, fc, bold = "#FFFFFF", C.SOURCE_COLORS["root"], "#333333", False
        else:
            col = C.source_color(f["sources"][i])
            if i in acc:
                bg, border, fc, bold = col, C.ACCEPTED_COLOR, C.text_color_on(col), True
            else:
                bg, border, fc, bold = C.tint(col, 0.22), C.tint(col, 0.75), "#4D4D4D", False
        annotations.append(dict(
            x=lay.cx[i], y=lay.cy[i], xref="x", yref="y", showarrow=False,
            text=f"<b>{esc(lab)}</b>" if bold else esc(lab),
            font=dict(family=C.MONO_FONT, size=lay.font_size, color=fc),
            bgcolor=bg, bordercolor=border, borderwidth=_BORDER, borderpad=_PAD,
            xanchor="center", yanchor="middle", captureevents=False))

    for t in C.legend_traces(C.legend_sources(f["sources"], [info_of(step)])):
        fig.add_trace(t)
    if lay.has_next:
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name="next root (model's own token)",
                                 line=dict(color=C.SOURCE_COLORS["root"], width=2, dash="dot"),
                                 meta={"role": "legend", "key": "next"}))

    n_acc = len(accepted) - 1
    by_src: dict[str, int] = {}
    for a in accepted[1:]:
        by_src[f["sources"][a]] = by_src.get(f["sources"][a], 0) + 1
    src_txt = ", ".join(f"{v} {k}" for k, v in by_src.items()) or "none"
    idx = get(step, "index", 0)
    head = title or f"Draft tree · step {idx + 1}"
    sub = (f"{n} candidate tokens checked in one forward pass · accepted {n_acc} draft token"
           f"{'s' if n_acc != 1 else ''} ({src_txt}) + root = {n_acc + 1} committed")
    if lay.compact:
        sub += "<br>Only the accepted path is labelled at this size: hover a dot for its token."
    elif any(lab is not None and lab != full for lab, full in zip(lay.labels, lay.full)):
        sub += f"<br>Labels cut to {lay.max_cells} characters to fit (…): hover a box for the full token."
    info = info_of(step)
    if info.get("chosen_T") is not None and info.get("candidates"):
        sub += (f"<br>Size chosen from this hardware's cost curve: {info['chosen_T']} of "
                f"{info['candidates']} candidates.")
    elif info.get("match_depth") is not None and not lay.compact:
        sub += (f"<br>Automaton match depth {info['match_depth']}, "
                f"{len(info.get('borders') or [])} border(s) feeding retrieval.")
    names = [t.name for t in fig.data if t.meta and t.meta.get("role") == "legend"]
    margin["t"] = C.top_margin(sub, names, width - margin["l"] - margin["r"])
    height = lay.plot_h + margin["t"] + margin["b"]
    layout = C.base_layout(head, sub, margin=margin, width=width, height=int(round(height)),
                           showlegend=True, annotations=annotations, hovermode="closest",
                           meta={"orientation": lay.orientation, "compact": lay.compact,
                                 "font_size": lay.font_size, "max_cells": lay.max_cells,
                                 "label_boxes": label_boxes(lay)},
                           xaxis=dict(visible=False, range=list(lay.x_range)),
                           yaxis=dict(visible=False, range=list(lay.y_range)))
    return fig.figure(layout)
