""""What if" for one step: the same step re-drafted another way, and how many tokens each tree
would have committed.

Under greedy decoding the model's tokens after this step are known (the run committed them), so
another tree's result is exact: the longest path from x0 that spells them (`racer.anatomy`).
`what_if_figure` compares the variants as bars (tokens committed, tree size in the label);
`what_if_tree_figure` draws one variant's tree with that path thick, reusing the draft tree.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import plotly.graph_objects as go

from . import colors as C
from . import stage_common as S
from .tree_figure import draft_tree_figure

VARIANT_COLOR = C.METHOD_COLORS["racer"]     # a RACER draft, another way
RUN_COLOR = C.ACCEPTED_COLOR                 # the run's own draft


def variant_label(variant: dict[str, Any], base: dict[str, Any] | None = None) -> str:
    """A variant in plain words, by how it differs from `base` (the run's own drafting)."""
    base = base or {"retrieval": True, "logits": True, "lookup": True, "capacity": "auto", "breadth_rule": "paper"}
    parts = []
    for key, words in (("retrieval", "retrieval"), ("logits", "copy-logits"), ("lookup", "prompt lookup")):
        if variant.get(key) != base.get(key):
            parts.append(("without " if not variant.get(key) else "with ") + words)
    if variant.get("capacity") != base.get("capacity"):
        cap = variant.get("capacity")
        parts.append("sized automatically" if cap == "auto" else f"fixed size {cap}")
    if variant.get("breadth_rule") != base.get("breadth_rule"):
        parts.append(f"{variant.get('breadth_rule')} breadth rule")
    return ", ".join(parts) if parts else "as the run drafted it"


def _is_run(result: dict[str, Any], base: dict[str, Any]) -> bool:
    return variant_label(result["variant"], base) == "as the run drafted it"


def what_if_figure(results: Sequence[dict[str, Any]], decode_one: Callable[[int], str] | None = None, *,
                   labels: Sequence[str] | None = None, width: int = 860,
                   title: str | None = None) -> go.Figure:
    """Tokens each re-drafted tree would have committed (`racer.anatomy.what_if` results; the
    first is taken as the run's own drafting and the others are named by how they differ).
    `labels` overrides the names. `decode_one` is unused (the bars need no token text); it keeps
    the signature of the other stage figures."""
    title = title or "What if this step had been drafted another way?"
    results = list(results)
    if not results:
        return S.note_figure(title, "No what-if results to compare.", width=width, meta={"rows": []})
    if all(r.get("committed") is None for r in results):
        return S.note_figure(title, "This run samples its tokens, so another tree would have met other random draws: "
                             "how many tokens it would have committed is not defined. Under greedy decoding it is "
                             "exact.", width=width, meta={"rows": [], "sampling": True})
    base = results[0]["variant"]
    names = list(labels) if labels is not None else [variant_label(r["variant"], base) for r in results]
    narrow = width < 560
    rows = []
    for r, name in zip(results, names):
        n = r.get("committed")
        more = "+" if r.get("limited") else ""
        text = ("—" if n is None else f"{n}{more} · {r.get('nodes')} nodes" if narrow else
                f"{n}{more} token{'s' if n != 1 else ''} · {r.get('nodes')}-node tree")
        rows.append({"name": name, "committed": n, "nodes": r.get("nodes"), "run": _is_run(r, base), "text": text})
    ys = [row["name"] for row in rows]
    fig = C.TraceList()
    fig.add_trace(go.Bar(
        y=ys, x=[row["committed"] or 0 for row in rows], orientation="h",
        marker=dict(color=[RUN_COLOR if row["run"] else VARIANT_COLOR for row in rows]),
        text=[row["text"] for row in rows], textposition="outside", cliponaxis=False,
        textfont=dict(size=11 if narrow else 12),
        hovertemplate=[f"<b>{row['name']}</b><br>{row['text']}<extra></extra>" for row in rows],
        showlegend=False, meta={"role": "bars", "rows": rows}))
    fig.add_trace(S.legend_key("the run's own draft", "run", color=RUN_COLOR))
    fig.add_trace(S.legend_key("the same step drafted another way", "variant", color=VARIANT_COLOR))
    top = max([row["committed"] or 0 for row in rows] + [1])
    sub = ("Tokens committed this step (x0 included) if the tree had been drafted as named, from the same state, "
           "and the size of that tree. The model's choices are known from the run, so these counts are exact; "
           "+ means the run ended first.")
    label_px = max(len(n) for n in ys) * 6.3 + 14
    margin = dict(l=int(min(label_px, 0.45 * width)), r=16, b=44)
    plot_w = width - margin["l"] - margin["r"]
    title_w = S.wrap(title, width - 20, S.TITLE_SIZE)
    sub_w = S.wrap(sub, width - 20, S.SUB_SIZE)
    legend_names = [t.name for t in fig.data if t.meta and t.meta.get("role") == "legend"]
    margin["t"] = S.top_margin(title_w, sub_w, legend_names, width - 20)
    row_h = 30
    layout = C.base_layout(title_w, sub_w, width=width, height=margin["t"] + margin["b"] + row_h * len(rows) + 10,
                           margin=margin, hovermode="closest", bargap=0.3,
                           meta={"rows": [{k: v for k, v in row.items()} for row in rows]})
    # Room on the right of the longest bar for its label ("12 tokens · 64-node tree").
    text_px = max(len(row["text"]) for row in rows) * (6.0 if narrow else 6.6) + 10
    x_max = top / max(0.2, 1 - text_px / max(plot_w, 1.0))
    layout["xaxis"] = dict(title=dict(text="tokens committed" if narrow else "tokens committed this step"),
                           range=[0, x_max],
                           dtick=1 if x_max <= (16 if not narrow else 8) else None, showgrid=True, zeroline=True)
    layout["yaxis"] = dict(autorange="reversed", tickfont=dict(size=11 if narrow else 12), automargin=False)
    # The legend starts near the figure's left edge, not after the long row names (a paper
    # coordinate left of the plot: plotly's container reference squeezes the plot here).
    layout["legend"] = dict(layout["legend"], x=-(margin["l"] - 8) / max(plot_w, 1.0))
    return fig.figure(layout)


def what_if_tree_figure(result: dict[str, Any], decode_one: Callable[[int], str], *, width: int = 860,
                        title: str | None = None, base: dict[str, Any] | None = None) -> go.Figure:
    """One what-if tree (a `racer.anatomy.what_if` result) with the path the model would have
    accepted drawn thick: the draft tree figure, with a subtitle that says what would happen."""
    name = variant_label(result["variant"], base)
    n = result.get("committed")
    step = {"tree": result["tree"], "accepted": list(result.get("path") or [0]), "forwarded": True, "next_root": None}
    head = title or f"What if: {name}"
    fig = draft_tree_figure(step, decode_one, width=width, title=S.wrap(head, width - 20, S.TITLE_SIZE))
    if n is None:
        sub = f"{result.get('nodes')} candidates. Under sampling the tokens this tree would commit are not defined."
    else:
        more = " (or more: the run ended first)" if result.get("limited") else ""
        sub = (f"{result.get('nodes')} candidates; the model would have accepted the thick path: {n} token"
               f"{'s' if n != 1 else ''} committed{more}, against {result.get('run_committed')} in the run.")
    sub = S.wrap(sub, width - 20, S.SUB_SIZE)
    old_t = fig.layout.margin.t
    names = [t.name for t in fig.data if t.meta and t.meta.get("role") == "legend"]
    new_t = S.top_margin(fig.layout.title.text, sub, names, width - fig.layout.margin.l - fig.layout.margin.r)
    fig.update_layout(title_subtitle_text=sub, margin_t=new_t, height=fig.layout.height - old_t + new_t)
    return fig
