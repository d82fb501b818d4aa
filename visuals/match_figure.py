"""Stage 1 of a step's anatomy: where the automaton stands, and how the new root x0 is added.

An alignment picture. The top row is the end of the text (the last `window` tokens) and then
x0, the token the model has just fixed, in the root colour. Under it, one bar per automaton
node the step visits, each spanning exactly the tokens its string spells:

* the match state: the last whole window, so it ends where the text ends;
* each failure link (dashed arrow): the longest shorter ending of the text that the automaton
  holds: the bar loses tokens on the left;
* the goto over x0: the first of those that x0 can follow; its bar ends under x0 (the arrival).

The arrival and its own failure chain (depth >= 2) are the borders, framed in the border
colour: what followed them earlier is what retrieval drafts. This is why a border such as
"⏎The" is not an ending of the match state's string: x0 ("The") is appended first; and why
"match depth 10" and "arrival depth 2" can both be true.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import plotly.graph_objects as go

from . import colors as C
from . import stage_common as S
from .tokens import esc, esc_hover, string_label, token_label, truncate

_MAX_CELL = 84.0     # px: wider token boxes only spread the picture
_MIN_CELL = 44.0     # px: narrower than this, tokens only the match state covers fold into one box
_TOKEN_H = 30.0
_BAR_H = 24.0
_WALK_PITCH = 40.0   # bar + room for the arrow to the next bar
_BORDER_PITCH = 36.0
_SECTION_H = 22.0
_LABEL_FONT = 11


@dataclass
class Bar:
    node: int
    move: str            # "state", "fail", "goto" or "border"
    depth: int
    freq: int
    tokens: list[int]
    first: int           # first token index covered in context_tail + [x0]
    last: int            # last token index covered (first > last: the empty string, depth 0)
    border: bool = False
    children: int | None = None


def _bars(match: dict[str, Any], n_ctx: int) -> tuple[list[Bar], list[Bar]]:
    """The walk's bars and the borders' bars beyond the arrival (deepest first)."""
    walk = []
    border_nodes = {b["node"] for b in match.get("borders") or []}
    for w in match.get("walk") or []:
        end = n_ctx if w["move"] == "goto" else n_ctx - 1
        walk.append(Bar(w["node"], w["move"], w["depth"], w.get("freq", 0), list(w.get("tokens") or []),
                        end - w["depth"] + 1, end, border=w["move"] == "goto" and w["node"] in border_nodes))
    arrival = walk[-1].node if walk and walk[-1].move == "goto" else None
    extra = []
    for b in match.get("borders") or []:
        if b["node"] == arrival:
            walk[-1].children = b.get("children")
            continue
        extra.append(Bar(b["node"], "border", b["depth"], b.get("freq", 0), list(b.get("tokens") or []),
                         n_ctx - b["depth"] + 1, n_ctx, border=True, children=b.get("children")))
    return walk, extra


def _context(match: dict[str, Any]) -> list[int]:
    """The text's last tokens, long enough for every bar (a short text may give fewer)."""
    ctx = [int(t) for t in match.get("context_tail") or []]
    for w in match.get("walk") or []:
        if w["move"] in ("state", "fail") and w["depth"] > len(ctx) and w.get("tokens"):
            ctx = [int(t) for t in w["tokens"][: w["depth"] - len(ctx)]] + ctx
    return ctx


def _bar_labels(b: Bar) -> list[str]:
    """Bar captions, longest first."""
    d = b.depth
    if b.move == "state":
        return [f"match state · depth {d}", f"state · depth {d}", f"state · {d}", f"{d}"]
    if b.move == "fail":
        if d == 0:
            return ["root · depth 0: nothing matched", "root: nothing matched", "root · 0", "0"]
        return [f"failure link → depth {d}", f"fail → depth {d}", f"fail → {d}", f"{d}"]
    if b.move == "goto":
        tag = "border" if b.border else "arrival"
        return [f"+ x0 → depth {d} (arrival, {tag})" if b.border else f"+ x0 → depth {d} (arrival)",
                f"+ x0 → depth {d}", f"goto → {d}", f"{d}"]
    kids = f" · {b.children} next token{'s' if b.children != 1 else ''}" if b.children is not None else ""
    return [f"border · depth {d}{kids}", f"border · depth {d}", f"border · {d}", f"{d}"]


def _fit_label(options: list[str], inside: float, left: float) -> tuple[str, str]:
    """(text, "inside" | "left"): the longest caption that fits in the bar or left of it."""
    for text in options:
        w = len(text) * S.SANS_ADVANCE * _LABEL_FONT + 8
        if w <= inside:
            return text, "inside"
        if w <= left:
            return text, "left"
    return options[-1], "inside"


def _summary(walk: list[Bar], borders: list[Bar]) -> str:
    if not walk:
        return "No match data."
    state = walk[0]
    fails = [b for b in walk if b.move == "fail"]
    goto = walk[-1] if walk[-1].move == "goto" else None
    parts = [f"The match state spells the last {state.depth} tokens of the text."]
    if fails:
        parts.append(f"It was never seen followed by x0, so {len(fails)} failure link{'s' if len(fails) != 1 else ''} "
                     f"{'drop' if len(fails) != 1 else 'drops'} tokens from the left"
                     + (f" until depth {fails[-1].depth}, which x0 can follow." if goto else
                        ", down to the empty string at the trie root."))
    if goto is None:
        parts.append("x0 was never seen in the automaton: no arrival, no borders, so retrieval proposes nothing "
                     "this step.")
    elif goto.depth < 2:
        parts.append("The arrival is x0 alone (depth 1): too short to say what comes next, so there are no borders "
                     "and retrieval proposes nothing this step.")
    else:
        nb = 1 + len(borders)
        parts.append(f"Arrival at depth {goto.depth}. It and its failure chain make {nb} border"
                     f"{'s' if nb != 1 else ''} (depth ≥ 2): endings of the text with x0 that were seen before. "
                     "What followed them is drafted in stage 2.")
    return " ".join(parts)


def match_figure(match: dict[str, Any] | None, decode_one: Callable[[int], str], *, width: int = 860,
                 title: str | None = None) -> go.Figure:
    """Stage 1 (`anatomy["match"]`): the text's end and x0 as boxes, and under them one bar per
    node of the walk (match state, failure links, goto over x0) and per border, each bar
    spanning the tokens its string spells. `layout.meta["bars"]` lists every bar with the
    token span it covers (indices into context_tail + [x0])."""
    title = title or "1 · Where are we? The match state and the borders"
    if match is None:
        return S.note_figure(title, "Retrieval is switched off in this run, so there is no automaton to match in.",
                             width=width, meta={"empty": "off", "bars": []})
    ctx = _context(match)
    root = int(match["root"])
    seq = ctx + [root]
    n_ctx = len(ctx)
    walk, more = _bars(match, n_ctx)
    bars = walk + more

    # Columns: one per token; on narrow screens the tokens only the match state covers fold into one.
    margin = dict(l=12, r=12, b=12)
    plot_w = width - margin["l"] - margin["r"]
    reach = max([n_ctx - b.first for b in bars if b.move != "state" and b.depth > 0] + [1])
    fold = n_ctx - reach if plot_w / (n_ctx + 1) < _MIN_CELL and n_ctx - reach >= 2 else 0
    n_cols = (1 if fold else 0) + (n_ctx - fold) + 1
    cw = min(_MAX_CELL, plot_w / n_cols)
    x_left = 0.0

    def col_of(i: int) -> int:
        return 0 if fold and i < fold else i - fold + (1 if fold else 0)

    def x0_of(i: int) -> float:
        return x_left + col_of(i) * cw

    def x1_of(i: int) -> float:
        return x_left + (col_of(i) + 1) * cw

    # Phones: a smaller font lets four characters of a token show in a 28 px box.
    font = 12 if cw >= 60 else 11 if cw >= 46 else 10 if cw >= 34 else 9
    max_cells = max(2, int((cw - 5) / (C.MONO_ADVANCE * font)))
    fig = C.TraceList()
    shapes: list[dict] = []
    ann: list[dict] = []
    hx, hy, htext = [], [], []

    # Header: what the row is, and x0's role.
    y = 0.0
    head_h = 34.0
    ann.append(dict(x=x_left, y=y - head_h + 4, xref="x", yref="y", xanchor="left", yanchor="bottom", showarrow=False,
                    align="left", text=f"the text so far<br>(last {n_ctx} tokens)" if plot_w < 560 else
                    f"the text so far (its last {n_ctx} tokens)", font=dict(size=11, color="#444444")))
    ann.append(dict(x=x1_of(n_ctx), y=y - head_h + 4, xref="x", yref="y", xanchor="right", yanchor="bottom",
                    showarrow=False, align="right", text="<b>x0</b>, just fixed<br>by the model ↓",
                    font=dict(size=11, color=C.SOURCE_COLORS["root"])))
    y -= head_h

    # The token row.
    top, bot = y, y - _TOKEN_H
    cols: list[tuple[float, float, str, str, str, str]] = []   # x0, x1, text, fill, line, hover
    if fold:
        folded = ctx[:fold]
        cols.append((x0_of(0), x1_of(0), f"…{fold}", "#FFFFFF", C.TRIE_EDGE_COLOR,
                     f"<b>{fold} earlier tokens</b><br>«{esc_hover(string_label(decode_one, folded, 60))}»"
                     "<br>only the match state covers them<extra></extra>"))
    for i in range(fold, n_ctx + 1):
        tok = seq[i]
        is_root = i == n_ctx
        text = token_label(decode_one, tok)
        hover = (f"<b>{esc_hover(text)}</b><br>token id: {tok}<br>"
                 + ("x0: the token the model just fixed" if is_root else f"{n_ctx - i} from the end of the text")
                 + "<extra></extra>")
        cols.append((x0_of(i), x1_of(i), truncate(text, max_cells),
                     C.SOURCE_COLORS["root"] if is_root else "#FFFFFF",
                     C.SOURCE_COLORS["root"] if is_root else C.TRIE_EDGE_COLOR, hover))
    for k, (a, b, text, fill, line, hover) in enumerate(cols):
        is_root = k == len(cols) - 1
        shapes.append(dict(type="rect", xref="x", yref="y", x0=a + 1.5, x1=b - 1.5, y0=bot, y1=top, fillcolor=fill,
                           line=dict(color=line, width=2.5 if is_root else 1.2,
                                     dash="dot" if fold and k == 0 else None),
                           name="x0" if is_root else f"token {k}"))
        ann.append(dict(x=(a + b) / 2, y=(top + bot) / 2, xref="x", yref="y", showarrow=False,
                        text=f"<b>{esc(text)}</b>" if is_root else esc(text),
                        font=dict(family=C.MONO_FONT, size=font,
                                  color=C.text_color_on(fill) if is_root else "#222222")))
        hx.append((a + b) / 2)
        hy.append((top + bot) / 2)
        htext.append(hover)
    y = bot - 10

    # The walk, then the borders beyond the arrival.
    def section(text: str) -> None:
        nonlocal y
        ann.append(dict(x=x_left, y=y - 2, xref="x", yref="y", xanchor="left", yanchor="top", showarrow=False,
                        align="left", text=text, font=dict(size=11, color="#555555")))
        y -= _SECTION_H

    section("<b>adding x0</b>: the automaton's walk" if plot_w >= 300 else "<b>adding x0</b>")
    placed: list[tuple[Bar, float, float, float, float]] = []   # bar, x0, x1, y top, y bottom
    for group, pitch in ((walk, _WALK_PITCH), (more, _BORDER_PITCH)):
        if group is more and more:
            y = placed[-1][4] - 8
            # A heading for the other borders where it clears their failure-link arrows.
            head = "<b>the other borders</b>: the arrival's failure chain"
            if S._visible_len(head) * S.SANS_ADVANCE * 11 + 12 < x0_of(more[0].first):
                section(head)
            else:
                y -= 10
        for b in group:
            t, bb = y, y - _BAR_H
            if b.depth > 0:
                a, e = x0_of(b.first), x1_of(b.last)
            else:   # the empty string: a sliver where the text ends
                a = e = x1_of(n_ctx - 1)
            placed.append((b, a, e, t, bb))
            y -= pitch
    y = placed[-1][4] - 4 if placed else y

    bar_meta = []
    for k, (b, a, e, t, bb) in enumerate(placed):
        if b.move == "state":
            fill, line, lw = C.tint(C.STATE_COLOR, 0.10), C.STATE_COLOR, 2.5
        elif b.move == "fail":
            fill, line, lw = C.tint(C.FAIL_LINK_COLOR, 0.12), C.FAIL_LINK_COLOR, 1.3
        elif b.border:
            fill, line, lw = C.tint(C.BORDER_COLOR, 0.16), C.BORDER_COLOR, 2.5
        else:
            fill, line, lw = C.tint(C.SOURCE_COLORS["root"], 0.14), C.SOURCE_COLORS["root"], 1.3
        role = "border" if b.move == "border" else "walk"
        name = f"{role} {k if role == 'walk' else k - len(walk)}"
        if b.depth > 0:
            shapes.append(dict(type="rect", xref="x", yref="y", x0=a + 1, x1=e - 1, y0=bb, y1=t, fillcolor=fill,
                               line=dict(color=line, width=lw), name=name))
        else:
            shapes.append(dict(type="rect", xref="x", yref="y", x0=a - 3, x1=a + 3, y0=bb, y1=t, fillcolor=line,
                               line=dict(color=line, width=1), name=name))
        text, where = _fit_label(_bar_labels(b), e - a - 2, a - x_left - 4)
        if b.depth == 0:
            text, where = _fit_label(_bar_labels(b), 0, a - x_left - 8)
        ann.append(dict(x=(a + e) / 2 if where == "inside" else a - 6, y=(t + bb) / 2, xref="x", yref="y",
                        showarrow=False, xanchor="center" if where == "inside" else "right", text=esc(text),
                        font=dict(size=_LABEL_FONT, color="#222222")))
        string = string_label(decode_one, b.tokens, 60) if b.tokens else "(empty: the trie root)"
        hover = (f"<b>«{esc_hover(string)}»</b><br>node {b.node} · depth {b.depth}"
                 f"<br>frequency: {b.freq} (inserted windows through it)"
                 f"<br>token ids: {' '.join(str(t) for t in b.tokens) or '—'}"
                 + {"state": "<br>the match state: the last whole window inserted",
                    "fail": "<br>reached by a failure link: the longest shorter ending held",
                    "goto": "<br>reached by following x0 (goto): the arrival",
                    "border": "<br>a border: on the arrival's failure chain"}[b.move]
                 + ("<br>a border: what followed it is drafted" if b.border and b.move != "border" else "")
                 + (f"<br>{b.children} different next tokens under it" if b.children is not None else "")
                 + "<extra></extra>")
        for x in _hover_points(a, e):
            hx.append(x)
            hy.append((t + bb) / 2)
            htext.append(hover)
        bar_meta.append({"node": b.node, "move": b.move, "depth": b.depth, "first": b.first, "last": b.last,
                         "border": b.border, "role": role, "x0": a, "x1": e})

    # Arrows: failure links (dashed) between consecutive bars that end with the text, the
    # goto from the last of them to the arrival (solid), and the failure chain of the borders.
    fx, fy, gx, gy = [], [], [], []
    heads = []

    def link(p: tuple, q: tuple, dashed: bool) -> None:
        _, a1, e1, _, b1 = p
        _, a2, e2, t2, _ = q
        if dashed:
            xs, ys, xe, ye = a1 + 5, b1, a2 + 5, t2
        else:
            xs, ys, xe, ye = e1 - 5, b1, e2 - 5, t2
        (fx if dashed else gx).extend([xs, xe, None])
        (fy if dashed else gy).extend([ys, ye, None])
        heads.append(dict(x=xe, y=ye, ax=xe - (xe - xs) * 0.25, ay=ye - (ye - ys) * 0.25, xref="x", yref="y",
                          axref="x", ayref="y", showarrow=True, arrowhead=2, arrowsize=1.2, arrowwidth=1.6,
                          arrowcolor=C.FAIL_LINK_COLOR if dashed else C.ACCEPTED_COLOR, text="", standoff=0))

    wp = placed[:len(walk)]
    for p, q in zip(wp, wp[1:]):
        link(p, q, q[0].move != "goto")
    chain = ([wp[-1]] if wp and wp[-1][0].border else []) + placed[len(walk):]
    for p, q in zip(chain, chain[1:]):
        link(p, q, True)
    fig.add_trace(go.Scatter(x=fx, y=fy, mode="lines", hoverinfo="skip", showlegend=False,
                             line=dict(color=C.FAIL_LINK_COLOR, width=1.6, dash="dash"), meta={"role": "fail_links"}))
    fig.add_trace(go.Scatter(x=gx, y=gy, mode="lines", hoverinfo="skip", showlegend=False,
                             line=dict(color=C.ACCEPTED_COLOR, width=1.8), meta={"role": "goto_link"}))
    fig.add_trace(go.Scatter(x=hx, y=hy, mode="markers", hovertemplate=htext, showlegend=False,
                             marker=dict(size=14, color="rgba(0,0,0,0)", symbol="square", line=dict(width=0)),
                             meta={"role": "hover"}))
    ann += heads

    for t in (S.legend_key("x0: the model's token", "root", color=C.SOURCE_COLORS["root"]),
              S.legend_key("match state", "state", color=C.tint(C.STATE_COLOR, 0.10), line_color=C.STATE_COLOR,
                           line_width=2.5),
              S.legend_key("failure link: a shorter ending", "fail", color=C.FAIL_LINK_COLOR, mode="lines",
                           dash="dash"),
              S.legend_key("goto: append x0", "goto", color=C.ACCEPTED_COLOR, mode="lines"),
              S.legend_key("border: feeds retrieval", "border", color=C.tint(C.BORDER_COLOR, 0.16),
                           line_color=C.BORDER_COLOR, line_width=2.5)):
        fig.add_trace(t)

    # What happened, in words, under the picture.
    summary = S.wrap(_summary(walk, more), plot_w, 12)
    sum_h = 16 * S.lines(summary) + 10
    ann.append(dict(x=x_left, y=y - 6, xref="x", yref="y", xanchor="left", yanchor="top", showarrow=False,
                    align="left", text=summary, font=dict(size=12, color="#333333")))
    y -= sum_h + 6

    window = match.get("window") or n_ctx
    sub = (f"The automaton remembers every stretch of {window} tokens of the text. Top: the text's last tokens, "
           "then x0. Each bar is an automaton node, drawn under the tokens it spells.")
    meta = {"bars": bar_meta, "columns": n_cols, "folded": fold, "cell_w": cw, "n_context": n_ctx,
            "root_fallback": any(b.move == "fail" and b.depth == 0 for b in walk),
            "borders": [b["node"] for b in match.get("borders") or []]}
    x_hi = x_left + plot_w
    return S.frame(fig, title, sub, width=width, plot_h=-y, margin=margin, x_range=(x_left, x_hi),
                   y_range=(y, 0.0), meta=meta, shapes=shapes, annotations=ann)


def _hover_points(a: float, e: float, step: float = 12.0) -> list[float]:
    """Points along a bar, so hovering anywhere on it shows its node."""
    if e - a <= step:
        return [(a + e) / 2]
    n = int((e - a) // step)
    return [a + (k + 0.5) * (e - a) / n for k in range(n)]
