"""Figure 2: the Aho–Corasick automaton around the match state, for one step.

The automaton stores every recent n-gram of the context as a path in a trie. The figure
draws a neighbourhood of 20–40 nodes, never the whole trie:

* trie edges (solid grey): "this token followed that string";
* failure links (dashed, curved, with arrowheads): from a node to the longest proper suffix
  of its string that is also in the trie (links to the root are left out: every node has one);
* the match state (black frame): the deepest node whose string ends the context;
* the borders (retrieval-blue frame): the state and its failure chain at depth >= 2; what grew
  under them before is what the retrieval tree proposes;
* node colour: LRU age (steps since the node was last used) on a fixed logarithmic grey scale
  with a colour bar, so greys mean the same thing at every step: dark = used just now, pale =
  not used for long. Old leaves are evicted first, so the pale ones are the next to go. Grey has
  no hue, so an age never reads as a draft source (`racer.palette`); labels are black or white,
  whichever reads better on their grey;
* the nodes evicted in this step are listed under the plot, and the caption gives the
  automaton's size against its capacity.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import plotly.graph_objects as go

from . import colors as C
from .tokens import esc, esc_hover, string_label, token_label
from .tree_figure import _edge_path, tree_layout

#: LRU age colour scale: log2(1 + age), fixed from 0 to AGE_MAX steps.
AGE_MAX = 255
AGE_TICKS = (0, 1, 3, 7, 15, 31, 63, 127, 255)


def age_value(age: float) -> float:
    """Position of an age on the fixed colour scale (0 .. log2(1 + AGE_MAX))."""
    return math.log2(1 + min(max(float(age), 0.0), AGE_MAX))


def node_age(node: dict[str, Any], step: int | None) -> float:
    if node.get("age") is not None:
        return float(node["age"])
    if step is not None and node.get("last_touch") is not None:
        return float(step - node["last_touch"])
    return 0.0


def select_neighbourhood(snapshot: dict[str, Any], max_nodes: int = 36) -> list[int]:
    """Node ids to draw: the root, the match state, the borders and what grew under them,
    then other recent nodes. The set is closed under parents (every drawn node's trie path
    is drawn) and under failure links (every drawn node's failure target is drawn), so each
    dashed arrow lands on a drawn node. The core (state, borders and their closure) is always
    kept even if it alone exceeds `max_nodes`."""
    nodes = {n["id"]: n for n in snapshot.get("nodes", [])}
    if not nodes:
        return []
    root = next((i for i, n in nodes.items() if n.get("parent", -1) in (-1, None)), min(nodes))
    chosen: list[int] = []
    chosen_set: set[int] = set()

    def closure(v: int) -> list[int]:
        out, stack, seen = [], [v], set()
        while stack:
            x = stack.pop()
            if x in seen or x in chosen_set or x not in nodes:
                continue
            seen.add(x)
            out.append(x)
            p = nodes[x].get("parent", -1)
            if p is not None and p >= 0:
                stack.append(p)
            f = nodes[x].get("fail")
            if f is not None and f >= 0:
                stack.append(f)
        return out

    def take(v: int, force: bool = False) -> bool:
        add = closure(v)
        if not add:
            return True
        if not force and len(chosen) + len(add) > max_nodes:
            return False
        for x in sorted(add, key=lambda i: nodes[i].get("depth", 0)):
            chosen.append(x)
            chosen_set.add(x)
        return True

    take(root, force=True)
    state = snapshot.get("state")
    borders = [b for b in (snapshot.get("borders") or []) if b in nodes]
    for v in ([state] if state in nodes else []) + borders:
        take(v, force=True)
    kids: dict[int, list[int]] = {}
    for i, n in nodes.items():
        p = n.get("parent", -1)
        if p is not None and p >= 0:
            kids.setdefault(p, []).append(i)
    # continuations under the borders, breadth-first, most frequent first (what retrieval reads)
    frontier = sorted(borders, key=lambda b: -nodes[b].get("depth", 0))
    while frontier:
        nxt = []
        for v in frontier:
            for c in sorted(kids.get(v, []), key=lambda c: -nodes[c].get("freq", 0)):
                if take(c):
                    nxt.append(c)
        frontier = nxt
    # then nodes flagged as used in the draft or touched this step, shallow and frequent first
    rest = sorted((i for i in nodes if i not in chosen_set),
                  key=lambda i: (0 if "selected" in (nodes[i].get("flags") or []) else
                                 1 if "recent" in (nodes[i].get("flags") or []) else 2,
                                 nodes[i].get("depth", 0), -nodes[i].get("freq", 0)))
    for v in rest:
        if len(chosen) >= max_nodes:
            break
        take(v)
    return chosen


def _bezier(p0, p1, bend: float, n: int = 40):
    (x0, y0), (x1, y1) = p0, p1
    mx, my = (x0 + x1) / 2, (y0 + y1) / 2
    dx, dy = x1 - x0, y1 - y0
    length = math.hypot(dx, dy) or 1.0
    off = bend * max(28.0, 0.28 * length)
    cx, cy = mx - dy / length * off, my + dx / length * off
    pts = []
    for k in range(n + 1):
        t = k / n
        pts.append(((1 - t) ** 2 * x0 + 2 * (1 - t) * t * cx + t * t * x1,
                    (1 - t) ** 2 * y0 + 2 * (1 - t) * t * cy + t * t * y1))
    return pts


def _inside(pt, box, pad=3.0):
    return box[0] - pad <= pt[0] <= box[2] + pad and box[1] - pad <= pt[1] <= box[3] + pad


def automaton_figure(snapshot: dict[str, Any], decode: Callable[[int], str] = str, *, width: int = 900,
                     max_nodes: int = 36, orientation: str = "auto", title: str | None = None) -> go.Figure:
    """The automaton neighbourhood of one step, from the drafter's snapshot dict:

    {"nodes": [{"id", "token", "depth", "freq", "parent" (-1 root), "fail", "age",
    "last_touch", "flags"}], "state": id, "borders": [ids], "evicted": [{"id", "token",
    "depth", "string": [ids]}], "size", "capacity", "step", "window"}.

    `layout.meta` records the drawn node ids and the number of failure links drawn.
    """
    nodes = {n["id"]: n for n in (snapshot or {}).get("nodes", [])}
    if not nodes:
        fig = C.blank_figure()
        fig.update_layout(**C.base_layout(title or "Automaton", "No automaton data in this step "
                                          "(retrieval off, or the record was made without detail).",
                                          width=width, height=160, xaxis=dict(visible=False),
                                          yaxis=dict(visible=False), meta={"drawn": [], "fail_links": 0, "links": []}))
        return fig
    ids = select_neighbourhood(snapshot, max_nodes)
    pos = {v: i for i, v in enumerate(ids)}
    step = snapshot.get("step")
    state = snapshot.get("state")
    borders = set(b for b in (snapshot.get("borders") or []) if b in pos)
    parents = []
    for v in ids:
        p = nodes[v].get("parent", -1)
        parents.append(pos[p] if p in pos else -1)
    depths = []
    for i, v in enumerate(ids):
        depths.append(0 if parents[i] < 0 else depths[parents[i]] + 1)

    def path_tokens(v: int) -> list[int]:
        out = []
        while v in nodes and nodes[v].get("parent", -1) not in (-1, None):
            out.append(nodes[v]["token"])
            v = nodes[v]["parent"]
        return out[::-1]

    texts = ["root" if parents[i] < 0 and nodes[v].get("token", -1) < 0 else token_label(decode, nodes[v]["token"])
             for i, v in enumerate(ids)]
    margin = dict(l=20, r=110, t=120, b=40)
    lay = tree_layout([nodes[v].get("token", -1) for v in ids], parents, depths, [], decode, width=width,
                      margin_lr=margin["l"] + margin["r"], orientation=orientation,
                      max_label_nodes=max(64, len(ids)), texts=texts)
    # One box per node (label_boxes skips unlabelled nodes, which happens on narrow screens).
    boxes = [(x - w / 2, y - h / 2, x + w / 2, y + h / 2) for x, y, w, h in zip(lay.cx, lay.cy, lay.w, lay.h)]
    vmax = age_value(AGE_MAX)
    ages = [node_age(nodes[v], step) for v in ids]
    fills = [C.age_color(age_value(a) / vmax) for a in ages]
    fig = C.TraceList()

    # trie edges
    ex, ey = [], []
    for i in range(len(ids)):
        if parents[i] >= 0:
            xs, ys = _edge_path(lay, parents[i], i)
            ex += xs
            ey += ys
    fig.add_trace(go.Scatter(x=ex, y=ey, mode="lines", name="trie edge (token that followed)",
                             line=dict(color=C.TRIE_EDGE_COLOR, width=1.6), hoverinfo="skip",
                             meta={"role": "trie_edges", "count": sum(p >= 0 for p in parents)}))

    # failure links: dashed quadratic curves, clipped to the boxes, arrowheads as annotations
    fx, fy, arrows, links = [], [], [], []
    outside = 0
    for i, v in enumerate(ids):
        f = nodes[v].get("fail")
        if f is not None and f > 0 and f not in pos:
            outside += 1   # its target is not in the snapshot: named in the hover, counted in the caption
        if f is None or f not in pos or parents[pos[f]] < 0 and nodes[f].get("token", -1) < 0:
            continue   # no link, not drawn, or to the root
        j = pos[f]
        if j == i:
            continue
        bend = 1.0 if lay.cx[j] <= lay.cx[i] else -1.0
        pts = _bezier((lay.cx[i], lay.cy[i]), (lay.cx[j], lay.cy[j]), bend)
        clipped = [p for p in pts if not _inside(p, boxes[i]) and not _inside(p, boxes[j])]
        pts = clipped if len(clipped) >= 3 else pts
        fx += [p[0] for p in pts] + [None]
        fy += [p[1] for p in pts] + [None]
        tail, head = pts[-3], pts[-1]
        arrows.append(dict(x=head[0], y=head[1], ax=tail[0], ay=tail[1], xref="x", yref="y", axref="x",
                           ayref="y", showarrow=True, arrowhead=2, arrowsize=1.3, arrowwidth=1.6,
                           arrowcolor=C.FAIL_LINK_COLOR, text="", standoff=0))
        links.append((v, f))
    fig.add_trace(go.Scatter(x=fx, y=fy, mode="lines", name="failure link → longest suffix in the trie",
                             line=dict(color=C.FAIL_LINK_COLOR, width=1.6, dash="dash"), hoverinfo="skip",
                             meta={"role": "fail_links", "count": len(links)}))

    # nodes: hover targets that also carry the age colour bar
    hover = []
    for i, v in enumerate(ids):
        n = nodes[v]
        flags = [fl for fl in (n.get("flags") or []) if fl != "root"]
        f = n.get("fail")
        if f in (None, -1, 0) or (f in nodes and nodes[f].get("token", -1) < 0):
            fail_txt = "root"
        elif f in pos:
            fail_txt = "«" + esc_hover(string_label(decode, path_tokens(f))) + "»"
        else:
            fail_txt = f"node {f} (outside this view)"
        hover.append(
            f"<b>«{esc_hover(string_label(decode, path_tokens(v)))}»</b><br>token: {esc_hover(texts[i])} (id {n.get('token')})"
            f"<br>depth: {n.get('depth', depths[i])}<br>frequency: {n.get('freq', 0)}"
            f"<br>LRU age: last used {ages[i]:g} steps ago (at step {n.get('last_touch', '—')})"
            f"<br>failure link → {fail_txt}" + (f"<br>flags: {', '.join(flags)}" if flags else "")
            + f"<extra>node {v}</extra>")
    fig.add_trace(go.Scatter(
        x=lay.cx, y=lay.cy, mode="markers", name="nodes", showlegend=False, hovertemplate=hover,
        marker=dict(size=[min(w, h) for w, h in zip(lay.w, lay.h)], symbol="square", color=[age_value(a) for a in ages],
                    colorscale=C.AGE_COLORSCALE, cmin=0, cmax=vmax, showscale=True,
                    colorbar=dict(title=dict(text=""),
                                  tickvals=[age_value(t) for t in AGE_TICKS],
                                  ticktext=[str(t) if t < AGE_MAX else f"≥{t}" for t in AGE_TICKS],
                                  len=0.78, y=0.0, yanchor="bottom", thickness=14, x=1.01, xanchor="left")),
        meta={"role": "nodes", "ids": list(ids)}))

    # node boxes + frames for the state and the borders
    annotations, shapes = [], []
    for i, v in enumerate(ids):
        is_border = v in borders
        annotations.append(dict(
            x=lay.cx[i], y=lay.cy[i], xref="x", yref="y", showarrow=False, text=esc(lay.labels[i] or ""),
            font=dict(family=C.MONO_FONT, size=lay.font_size, color=C.text_color_on(fills[i])),
            bgcolor=fills[i], bordercolor=C.BORDER_COLOR if is_border else fills[i], borderwidth=2,
            borderpad=2, xanchor="center", yanchor="middle"))
        if v == state or is_border:
            x0, y0, x1, y1 = boxes[i]
            pad = 4.5 if v == state else 3.5
            shapes.append(dict(type="rect", xref="x", yref="y", x0=x0 - pad, x1=x1 + pad, y0=y0 - pad, y1=y1 + pad,
                               line=dict(color=C.STATE_COLOR if v == state else C.BORDER_COLOR,
                                         width=3 if v == state else 2.5), fillcolor="rgba(0,0,0,0)", layer="above"))
    annotations += arrows
    annotations.append(dict(xref="paper", yref="paper", x=1.01, y=0.80, xanchor="left", yanchor="bottom",
                            showarrow=False, align="left",
                            # On a phone the colour bar's column is narrow: the short form.
                            text=("LRU age: last<br>used N steps<br>ago (pale: next<br>to be recycled)" if width >= 520
                                  else "age<br>(steps)"),
                            font=dict(size=12 if width >= 520 else 10)))

    fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name="match state (deepest suffix of the context)",
                             marker=dict(symbol="square-open", size=16, color=C.STATE_COLOR, line=dict(width=3)),
                             meta={"role": "legend", "key": "state"}))
    fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name="border (feeds the retrieval tree)",
                             marker=dict(symbol="square-open", size=16, color=C.BORDER_COLOR, line=dict(width=3)),
                             meta={"role": "legend", "key": "border"}))

    # captions: size vs capacity, evictions
    size, cap = snapshot.get("size"), snapshot.get("capacity")
    sub = []
    if size is not None and cap:
        sub.append(f"Automaton holds {size:,} / {cap:,} nodes ({100 * size / cap:.0f}% full)")
    sub.append(f"showing {len(ids)} around the match state")
    if snapshot.get("window"):
        sub.append(f"n-gram window {snapshot['window']}")
    subtitle = " · ".join(sub)
    st = nodes.get(state)
    if st is not None:
        subtitle += (f"<br>Match state «{esc(string_label(decode, path_tokens(state), 40))}» at depth "
                     f"{st.get('depth', 0)}; {len(borders)} border(s); failure links to the root not drawn"
                     + (f";<br>{outside} failure link{'s' if outside != 1 else ''} lead{'s' if outside == 1 else ''} "
                        "to nodes outside this view (hover a node to see where)." if outside else "."))
    evicted = snapshot.get("evicted") or []
    if evicted:
        items = [f"«{esc(string_label(decode, e.get('string') or [e.get('token', -1)], 24))}»" for e in evicted[:6]]
        ev = (f"Evicted this step ({len(evicted)} least-recently-used leaf node{'s' if len(evicted) != 1 else ''}): "
              + ", ".join(items) + (f" and {len(evicted) - 6} more" if len(evicted) > 6 else ""))
    else:
        ev = "No evictions this step."
    margin["b"] = 44
    annotations.append(dict(xref="paper", yref="paper", x=0, y=0, yshift=-10, xanchor="left", yanchor="top",
                            showarrow=False, align="left", text=ev, font=dict(size=12, color="#333333")))
    names = [t.name for t in fig.data if t.showlegend is not False]
    margin["t"] = C.top_margin(subtitle, names, width - margin["l"] - margin["r"])
    layout = C.base_layout(
        title or f"Automaton around the match state · step {step if step is not None else '?'}", subtitle,
        margin=margin, width=width, height=int(lay.plot_h + margin["t"] + margin["b"]),
        annotations=annotations, shapes=shapes, hovermode="closest",
        meta={"drawn": list(ids), "fail_links": len(links), "fail_links_outside": outside, "links": [list(x) for x in links],
              "orientation": lay.orientation, "evicted": len(evicted)},
        xaxis=dict(visible=False, range=list(lay.x_range)), yaxis=dict(visible=False, range=list(lay.y_range)))
    return fig.figure(layout)
