"""Stages 2–4 of a step's anatomy: the candidate trees, before the model has seen any of them.

* `retrieval_candidates_figure` (stage 2): what followed the borders earlier in the text;
* `logits_tree_figure` (stage 3): the copy-logit tree grown from x0, one column per layer, with
  a `layer` argument so the app can step through the growth;
* `merged_pool_figure` (stage 4): every candidate in one tree, and the sizer's cut.

One look for all three, taken from the draft tree (`tree_figure.tree_layout` places the
boxes): a candidate the sizer kept (it goes to the model) is solid in its source colour, one
it cut is hollow with a dotted outline. Pools of up to 128 nodes would be a wall of dots, so at
most `max_nodes` are drawn: the kept ones and the most likely others, every drawn node's
ancestors included; the subtitle says how many were left out. Labels that do not fit the
width become dots (hover shows everything).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import plotly.graph_objects as go

from . import colors as C
from . import stage_common as S
from .tokens import cells, esc, esc_hover, token_label
from .tree_figure import TreeLayout, _edge_path, box_size, tree_layout

#: Nodes drawn at most (kept ones first, then the most likely, ancestors included).
MAX_NODES = 40
#: Labelled cut candidates when the pool is too big to label all: the best few.
BEST_CUT = 4
_HEADER_FONT = 11


@dataclass
class Candidates:
    """A candidate tree in drawing order: node 0 is x0; parents index into the lists."""
    tokens: list[int]
    parents: list[int]
    sources: list[str]
    kept: list[bool]
    hover: list[str]
    sub: list[str | None] = field(default_factory=list)      # small text after the token
    lookup: list[bool] = field(default_factory=list)         # on the prompt-lookup chain
    score: list[float] = field(default_factory=list)         # likelihood, to choose what is drawn
    ids: list[int] = field(default_factory=list)             # index in the stage's own data (-1: x0)

    @property
    def depths(self) -> list[int]:
        out: list[int] = []
        for p in self.parents:
            out.append(0 if p < 0 else out[p] + 1)
        return out


# -- which nodes to draw ---------------------------------------------------------------------

def choose_drawn(c: Candidates, cap: int, must: Iterable[int] = ()) -> list[int]:
    """Node indices to draw, in tree order: x0, `must` and the kept nodes, then the highest
    scores, each with its ancestors, while the total stays within `cap`."""
    chosen: set[int] = {0}

    def add(i: int, force: bool) -> None:
        path = []
        while i >= 0 and i not in chosen:
            path.append(i)
            i = c.parents[i]
        if force or len(chosen) + len(path) <= cap:
            chosen.update(path)

    for i in list(must) + [i for i, k in enumerate(c.kept) if k]:
        add(i, True)
    score = c.score or [0.0] * len(c.tokens)
    for i in sorted(range(1, len(c.tokens)), key=lambda i: (-score[i], i)):
        if len(chosen) >= cap:
            break
        add(i, False)
    return sorted(chosen)


def subset(c: Candidates, keep: list[int]) -> Candidates:
    """The candidates `keep` (ancestor-closed, in tree order), reindexed."""
    new = {old: k for k, old in enumerate(keep)}

    def pick(xs: list) -> list:
        return [xs[i] for i in keep] if xs else []

    return Candidates([c.tokens[i] for i in keep], [new.get(c.parents[i], -1) for i in keep], pick(c.sources),
                      pick(c.kept), pick(c.hover), pick(c.sub), pick(c.lookup), pick(c.score),
                      pick(c.ids) or list(keep))


# -- layout and drawing ----------------------------------------------------------------------

def _sub_font(font: int) -> int:
    return max(8, font - 3)


def _place(c: Candidates, decode: Callable[[int], str], width: int, margin_lr: float, orientation: str,
           labelled: Iterable[int]) -> tuple[TreeLayout, bool]:
    """The layout, and whether the small texts fit: every node labelled with its small text
    if that fits, else labels only, else dots with `labelled` the only labels."""
    texts = [token_label(decode, t) for t in c.tokens]
    depths = c.depths
    n = len(c.tokens)

    def box(with_sub: bool):
        def size(i: int, lab: str, font: int) -> tuple[float, float]:
            w, h = box_size(lab, font)
            s = c.sub[i] if with_sub and c.sub else None
            if s:
                w += (cells(s) + 1) * C.MONO_ADVANCE * _sub_font(font)
            return w, h
        return size

    for with_sub in ((True, False) if c.sub and any(c.sub) else (False,)):
        lay = tree_layout(c.tokens, c.parents, depths, [], decode, width=width, margin_lr=margin_lr,
                          orientation=orientation, max_label_nodes=n, texts=texts, box=box(with_sub))
        if not lay.compact:
            return lay, with_sub
    compact_orient = "tb" if orientation == "auto" else orientation
    return tree_layout(c.tokens, c.parents, depths, [], decode, width=width, margin_lr=margin_lr,
                       orientation=compact_orient, max_label_nodes=0, texts=texts, labelled=set(labelled),
                       box=box(False)), False


def _text_px(text: str) -> float:
    return max(S._visible_len(line) for line in text.split("<br>")) * S.SANS_ADVANCE * _HEADER_FONT


def _header_text(options: list[str], span: float) -> str:
    """The first header option whose every line fits `span` px."""
    for opt in options:
        if _text_px(opt) <= span:
            return opt
    return options[-1]


def draw_candidates(c: Candidates, decode: Callable[[int], str], *, width: int, title: str, subtitle: str,
                    orientation: str = "auto", headers: Callable[[int], list[str]] | None = None,
                    labelled: Iterable[int] = (), legend_extra: list[go.Scatter] | None = None,
                    meta: dict[str, Any] | None = None) -> go.Figure:
    """Draw a candidate tree: kept nodes solid, cut ones hollow; `headers(depth)` gives the
    column header options (longest first) in a left-to-right layout."""
    margin = dict(l=12, r=12, b=14)
    lay, with_sub = _place(c, decode, width, margin["l"] + margin["r"], orientation, labelled)
    n = len(c.tokens)
    fig = C.TraceList()

    # Edges: into kept nodes solid, into cut ones faded; the lookup chain in its colour on top.
    kept_xy: tuple[list, list] = ([], [])
    cut_xy: tuple[list, list] = ([], [])
    chain_xy: tuple[list, list] = ([], [])
    for i in range(1, n):
        p = c.parents[i]
        if p < 0:
            continue
        xs, ys = _edge_path(lay, p, i)
        dest = kept_xy if c.kept[i] else cut_xy
        dest[0].extend(xs)
        dest[1].extend(ys)
        if c.lookup and c.lookup[i] and (p == 0 or c.lookup[p]):
            chain_xy[0].extend(xs)
            chain_xy[1].extend(ys)
    fig.add_trace(go.Scatter(x=cut_xy[0], y=cut_xy[1], mode="lines", showlegend=False, hoverinfo="skip",
                             line=dict(color=C.REJECTED_COLOR, width=1.1), meta={"role": "cut_edges"}))
    fig.add_trace(go.Scatter(x=kept_xy[0], y=kept_xy[1], mode="lines", showlegend=False, hoverinfo="skip",
                             line=dict(color=C.TRIE_EDGE_COLOR, width=2.0), meta={"role": "kept_edges"}))
    if chain_xy[0]:
        fig.add_trace(go.Scatter(x=chain_xy[0], y=chain_xy[1], mode="lines", showlegend=False, hoverinfo="skip",
                                 line=dict(color=C.SOURCE_COLORS["lookup"], width=3.0),
                                 meta={"role": "lookup_chain"}))

    shapes, annotations = [], []
    dots: dict[bool, tuple[list, list, list]] = {True: ([], [], []), False: ([], [], [])}
    for i in range(n):
        col = C.source_color(c.sources[i])
        lab = lay.labels[i]
        if lab is None:
            d = dots[c.kept[i]]
            d[0].append(lay.cx[i])
            d[1].append(lay.cy[i])
            d[2].append(col)
            continue
        x0, x1 = lay.cx[i] - lay.w[i] / 2, lay.cx[i] + lay.w[i] / 2
        y0, y1 = lay.cy[i] - lay.h[i] / 2, lay.cy[i] + lay.h[i] / 2
        if c.kept[i]:
            fill, line, fc, dash = col, col, C.text_color_on(col), "solid"
        else:
            fill, line, fc, dash = S.HOLLOW, col, "#444444", S.CUT_DASH
        shapes.append(dict(type="rect", xref="x", yref="y", x0=x0, x1=x1, y0=y0, y1=y1, fillcolor=fill,
                           line=dict(color=line, width=1.6 if c.kept[i] else 1.4, dash=dash), layer="above",
                           name=f"node {i}"))
        text = esc(lab)
        if with_sub and c.sub and c.sub[i]:
            text += f" <span style='font-size:{_sub_font(lay.font_size)}px'>{esc(c.sub[i])}</span>"
        annotations.append(dict(x=lay.cx[i], y=lay.cy[i], xref="x", yref="y", showarrow=False, text=text,
                                font=dict(family=C.MONO_FONT, size=lay.font_size, color=fc),
                                xanchor="center", yanchor="middle", captureevents=False))
    for is_kept, (xs, ys, cols) in dots.items():
        if xs:
            fig.add_trace(go.Scatter(
                x=xs, y=ys, mode="markers", showlegend=False, hoverinfo="skip",
                marker=dict(size=9, color=cols if is_kept else S.HOLLOW, symbol="circle",
                            line=dict(color=cols, width=1.8)),
                meta={"role": "dots_kept" if is_kept else "dots_cut", "count": len(xs)}))
    fig.add_trace(go.Scatter(
        x=lay.cx[:n], y=lay.cy[:n], mode="markers", showlegend=False, hovertemplate=c.hover,
        marker=dict(size=[max(lay.w[i], lay.h[i]) if lay.labels[i] is not None else 11 for i in range(n)],
                    color="rgba(0,0,0,0)", symbol="square", line=dict(width=0)),
        meta={"role": "nodes", "kept": list(c.kept), "ids": list(c.ids), "sources": list(c.sources)}))

    # Column headers above a left-to-right tree: what each layer was grown from.
    header_h = 0.0
    x_lo, x_hi = lay.x_range
    y_lo, y_hi = lay.y_range
    if headers is not None and lay.orientation == "lr":
        depths = c.depths
        lefts: dict[int, float] = {}
        for i in range(n):
            lefts[depths[i]] = min(lefts.get(depths[i], 1e9), lay.cx[i] - lay.w[i] / 2)
        ds = sorted(lefts)
        header_h = 2 * 14 + 8
        for k, d in enumerate(ds):
            last = k + 1 == len(ds)
            # Plotly hides an annotation anchored outside the axis range: keep anchors inside.
            left = max(lefts[d], x_lo)
            right = x_hi if last else lefts[ds[k + 1]]
            text = _header_text(headers(d), right - left - 4 + (margin["r"] if last else 0))
            if last:   # may reach into the right margin, and shifts left where even that is short
                left = min(left, x_hi + margin["r"] - _text_px(text) - 2)
            annotations.append(dict(x=left, y=y_hi + header_h - 4, xref="x", yref="y",
                                    showarrow=False, xanchor="left", yanchor="top",
                                    align="left", text=text, font=dict(size=_HEADER_FONT, color="#333333"),
                                    name=f"header {d}"))

    for t in S.source_legend(c.sources) + S.kept_cut_legend() + (legend_extra or []):
        fig.add_trace(t)
    sub = subtitle
    if lay.compact:
        sub += " Too many to label at this width: solid dots were kept, hollow ones cut; hover a dot for its token."
    m = dict(meta or {})
    m.update({"orientation": lay.orientation, "compact": lay.compact, "small_text": with_sub,
              "drawn": list(c.ids), "kept": list(c.kept),
              "labelled": [i for i in range(n) if lay.labels[i] is not None],
              "depths": c.depths})
    return S.frame(fig, title, sub, width=width, plot_h=lay.plot_h + header_h, margin=margin,
                   x_range=(x_lo, x_hi), y_range=(y_lo, y_hi + header_h), meta=m, shapes=shapes,
                   annotations=annotations)


# -- hover text ------------------------------------------------------------------------------

def _hover(decode: Callable[[int], str], token: int, lines: list[str], kept: bool, node: str) -> str:
    status = "kept: the model checks it" if kept else "cut by the sizer: never shown to the model"
    return (f"<b>{esc_hover(token_label(decode, token))}</b><br>token id: {token}<br>"
            + "<br>".join(lines) + f"<br>{status}<extra>{node}</extra>")


def _root_hover(decode: Callable[[int], str], root: int | None) -> str:
    if root is None or root < 0:
        return "<b>x0</b><br>the token the model just fixed<extra>x0</extra>"
    return (f"<b>{esc_hover(token_label(decode, root))}</b><br>token id: {root}<br>x0: the token the model just "
            "fixed; every candidate grows from it<extra>x0</extra>")


# -- stage 2: retrieval ----------------------------------------------------------------------

def retrieval_candidates_figure(retrieval: dict[str, Any] | None, decode_one: Callable[[int], str], *,
                                root: int | None = None, width: int = 860, title: str | None = None,
                                max_nodes: int = MAX_NODES) -> go.Figure:
    """Stage 2: the retrieval candidates (`anatomy["retrieval"]`), grown from x0 (`root`).

    Each candidate is a token that followed one of the borders earlier in the text, with ×n
    the times it did. Kept candidates solid, cut ones hollow."""
    title = title or "2 · Seen before: what followed these words earlier"
    if retrieval is None:
        return S.note_figure(title, "Retrieval is switched off in this run, so nothing is looked up.", width=width,
                             meta={"empty": "off"})
    cands = retrieval.get("candidates") or []
    if not cands:
        return S.note_figure(title, "Retrieval found nothing this step: no suffix of two or more tokens ending "
                             "in x0 was seen before, so there are no borders to continue from. The tree is "
                             "drafted from the other sources.", width=width, meta={"empty": "nothing"})
    borders = {b["node"]: b for b in retrieval.get("borders") or []}
    x0 = -1 if root is None else int(root)
    c = Candidates([x0], [-1], ["root"], [True], [_root_hover(decode_one, root)], ["x0"], [], [2.0], [-1])
    for i, cd in enumerate(cands):
        b = borders.get(cd.get("border"))
        seen = (f"after «{esc_hover(''.join(token_label(decode_one, t) for t in b['tokens'][-8:]))}» "
                f"(border of depth {b['depth']})" if b else f"under a border of depth {cd.get('border_depth')}")
        lines = [f"followed {cd['freq']}× {seen}", f"rank among its siblings: {cd['rank']}",
                 f"depth below x0: {cd['depth']}"]
        c.tokens.append(int(cd["token"]))
        c.parents.append(cd["parent"] + 1)
        c.sources.append("retrieval")
        c.kept.append(bool(cd.get("kept")))
        c.hover.append(_hover(decode_one, cd["token"], lines, bool(cd.get("kept")), f"candidate {i}"))
        c.sub.append(f"×{cd['freq']}")
        c.score.append(float(cd["freq"]) / (1 + cd["depth"]))
        c.ids.append(i)
    keep = choose_drawn(c, max_nodes)
    left_out = len(c.tokens) - len(keep)
    c = subset(c, keep)
    nb = len(borders)
    sub = ((f"The {nb} borders of stage 1 are endings of the text seen before; what followed them then"
            if nb != 1 else "The border of stage 1 is an ending of the text seen before; what followed it then")
           + " is proposed now, layer by layer, most frequent first. ×n = how often.")
    if left_out:
        sub += f" {left_out} rarer candidates not drawn."
    return draw_candidates(c, decode_one, width=width, title=title, subtitle=sub,
                           meta={"stage": "retrieval", "not_drawn": left_out})


# -- stage 3: the copy-logit tree ------------------------------------------------------------

def _layer_headers(d: int) -> list[str]:
    if d == 0:
        return ["<b>x0</b><br>the root", "<b>x0</b>"]
    src = "x0's row" if d == 1 else f"layer {d - 1}'s rows"
    short = "x0" if d == 1 else f"L{d - 1}"
    return [f"<b>layer {d}</b><br>from {src}", f"<b>layer {d}</b><br>from {short}", f"<b>layer {d}</b>",
            f"<b>L{d}</b>", f"{d}"]


def logits_tree_figure(logits: dict[str, Any] | None, decode_one: Callable[[int], str], *,
                       root: int | None = None, layer: int | None = None, width: int = 860,
                       title: str | None = None, max_nodes: int = MAX_NODES) -> go.Figure:
    """Stage 3: the copy-logit tree (`anatomy["logits"]`), left to right, one column per layer.

    `layer` shows only the first `layer` layers (None: all), so the growth can be stepped
    through. Each node shows its token and "r·b": its rank in its parent's copy-logit row and
    its breadth (how many entries of its own row it may add in the next layer)."""
    title = title or "3 · What the model predicted before: the copy-logit tree"
    if logits is None:
        return S.note_figure(title, "The copy-logit signal is switched off in this run.", width=width,
                             meta={"empty": "off"})
    nodes = logits.get("nodes") or []
    if not nodes:
        return S.note_figure(title, "No copy-logit tree this step: x0 has no row yet (the model was never fed this "
                             "token before), or the tree had no room left.", width=width, meta={"empty": "nothing"})
    total_layers = max(n["depth"] for n in nodes)
    upto = total_layers if layer is None else max(0, min(int(layer), total_layers))
    x0 = -1 if root is None else int(root)
    c = Candidates([x0], [-1], ["root"], [True], [_root_hover(decode_one, root)], ["x0"], [], [1.0], [-1])
    where: dict[int, int] = {}
    for i, nd in enumerate(nodes):
        if nd["depth"] > upto:
            continue
        parent = 0 if nd["parent"] < 0 else where.get(nd["parent"], -1)
        if parent < 0:
            continue
        where[i] = len(c.tokens)
        p = float(nd.get("prob") or 0.0)
        lines = [f"layer {nd['depth']}: entry {nd['rank']} of its parent's copy-logit row",
                 f"probability in that row: {p:.3f}", f"breadth {nd['breadth']}: may add up to {nd['breadth']} "
                 "entries of its own row"]
        c.tokens.append(int(nd["token"]))
        c.parents.append(parent)
        c.sources.append("logits")
        c.kept.append(bool(nd.get("kept")))
        c.hover.append(_hover(decode_one, nd["token"], lines, bool(nd.get("kept")), f"layer {nd['depth']}"))
        c.sub.append(f"r{nd['rank']}·b{nd['breadth']}")
        c.score.append(c.score[parent] * max(p, 1e-9))
        c.ids.append(i)
    # The first layer always (it shows the breadth rule at work) and the likeliest path to the
    # last layer shown (every column gets a node), then the most likely others.
    depths = c.depths
    first = [k for k in range(1, len(c.tokens)) if depths[k] == 1]
    deepest = max((k for k in range(len(c.tokens)) if depths[k] == max(depths)), key=lambda k: c.score[k])
    keep = choose_drawn(c, max(max_nodes, len(first) + 1), must=first + [deepest])
    left_out = len(c.tokens) - len(keep)
    c = subset(c, keep)
    shown = max(c.depths)
    sub = ("Every token remembers the model's top next tokens from its last appearance (its copy-logit row). "
           "Layer 1 reads x0's row, each next layer the rows of the layer before. r = rank in the row; "
           "b = breadth, how many entries of its own row a node may add.")
    if upto < total_layers:
        sub += f" Showing layer{'s' if upto != 1 else ''} 1–{upto} of {total_layers}."
    if left_out:
        sub += f" {left_out} less likely node{'s' if left_out != 1 else ''} not drawn."
    labelled = [0]
    return draw_candidates(c, decode_one, width=width, title=title, subtitle=sub, orientation="lr",
                           headers=_layer_headers, labelled=labelled,
                           meta={"stage": "logits", "layers_shown": shown, "layers_total": total_layers,
                                 "not_drawn": left_out})


# -- stage 4: the merged pool and the cut ----------------------------------------------------

def merged_pool_figure(merge: dict[str, Any], decode_one: Callable[[int], str], *, width: int = 860,
                       title: str | None = None, max_nodes: int = MAX_NODES) -> go.Figure:
    """Stage 4: the merged pool (`anatomy["merge"]`): prompt lookup, retrieval and copy-logit
    candidates in one tree, shared prefixes merged; the sizer's kept nodes solid, cut hollow.
    Nodes on the prompt-lookup chain are joined by thick lookup-coloured edges."""
    title = title or "4 · One pool, then the cut: the merged candidate tree"
    pool = merge["pool"]
    n = len(pool["tokens"])
    kept = [k >= 0 for k in merge.get("kept") or [0] * n]
    p_acc = merge.get("p_accept")
    lookup = list(merge.get("lookup") or [False] * n)
    c = Candidates([], [], [], [], [], [], [], [], [])
    for i in range(n):
        tok, src = int(pool["tokens"][i]), pool["sources"][i]
        if i == 0:
            c.hover.append(_root_hover(decode_one, tok))
        else:
            lines = [f"source: {C.SOURCE_NAMES.get(src, src)}", f"depth {pool['depths'][i]}, rank {pool['ranks'][i]}"]
            if p_acc:
                lines.append(f"estimated P(accepted): {p_acc[i]:.2f}")
            if lookup[i]:
                lines.append("on the prompt-lookup chain")
            c.hover.append(_hover(decode_one, tok, lines, kept[i], f"node {i}"))
        c.tokens.append(tok)
        c.parents.append(int(pool["parents"][i]))
        c.sources.append(src)
        c.kept.append(kept[i])
        c.sub.append("x0" if i == 0 else (_pct(p_acc[i]) if p_acc else None))
        c.lookup.append(bool(lookup[i]))
        c.score.append(float(p_acc[i]) if p_acc else 1.0 / (1 + pool["depths"][i]))
        c.ids.append(i)
    keep = choose_drawn(c, max_nodes)
    left_out = n - len(keep)
    c = subset(c, keep)
    order = sorted((k for k in range(1, len(c.tokens)) if not c.kept[k]), key=lambda k: -c.score[k])
    labelled = [0] + [k for k in range(len(c.tokens)) if c.kept[k]] + order[:BEST_CUT]
    n_kept = sum(kept)
    if merge.get("auto"):
        sub = (f"All {n} candidates in one tree (shared beginnings merged). The sizer kept the {n_kept} most "
               "likely to be accepted (solid; % = estimated chance) and cut the rest (hollow).")
    else:
        sub = (f"All {n} candidates in one tree (shared beginnings merged), up to the fixed size of "
               f"{merge.get('capacity')} nodes; nothing is cut.")
    if left_out:
        sub += f" {left_out} less likely candidates (all cut) not drawn."
    extra = []
    if any(c.lookup):
        extra.append(S.legend_key("prompt-lookup chain", "lookup_chain", color=C.SOURCE_COLORS["lookup"],
                                  mode="lines", line_width=3))
    return draw_candidates(c, decode_one, width=width, title=title, subtitle=sub, labelled=labelled,
                           legend_extra=extra, meta={"stage": "merge", "not_drawn": left_out})


def _pct(p: float) -> str:
    return f"{100 * p:.0f}%" if p >= 0.01 else "<1%"
