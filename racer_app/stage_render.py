"""Pictures and tables of the anatomy's stages and of "what if", from `racer.anatomy` data.

Each stage gets a main figure, at most one second figure and an HTML table where a table reads
better than a picture (copy-logit rows, what was inserted and evicted)."""
from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

import plotly.graph_objects as go

from visuals import (attention_mask_figure, automaton_figure, logits_tree_figure, match_figure, merged_pool_figure,
                     retrieval_candidates_figure, sizer_figure, verify_figure, what_if_figure, what_if_tree_figure)
from visuals.stage_common import note_figure
from visuals.colors import SOURCE_COLORS, tint
from visuals.tokens import string_label, token_label, truncate

from .anatomy_text import STAGE_TITLES
from .session import Trace


@dataclass
class StageView:
    figure: go.Figure
    second: go.Figure | None = None
    html: str = ""


def _tok(decode: Any, t: int, n: int = 12) -> str:
    return html.escape(truncate(token_label(decode, int(t)), n))


def borders_html(a: dict[str, Any], decode: Any) -> str:
    m = a.get("match") or {}
    b = m.get("borders") or []
    if not b:
        return ""
    rows = "".join(f"<tr><td>{x['depth']}</td><td class='racer-mono'>{html.escape(string_label(decode, x['tokens'], 48))}"
                   f"</td><td>{x['freq']}</td><td>{x.get('children', '')}</td></tr>" for x in b)
    return ("<div class='racer-rows'><table><thead><tr><th>depth</th><th>border (ends the text + x0)</th>"
            "<th>seen</th><th>continuations</th></tr></thead><tbody>" + rows + "</tbody></table></div>")


def logits_rows_html(a: dict[str, Any], decode: Any) -> str:
    lg = a.get("logits") or {}
    rows = lg.get("rows") or []
    if not rows:
        return ""
    grown: dict[int, set[int]] = {}
    nodes = lg.get("nodes") or []
    for n in nodes:
        par_tok = a["root"] if n["parent"] < 0 else nodes[n["parent"]]["token"]
        grown.setdefault(par_tok, set()).add(n["rank"])
    out = ["<div class='racer-rows'><table><thead><tr><th>row of</th><th>breadth</th><th>its top next tokens when it "
           "was last fed (rank 1 → K; probability)</th></tr></thead><tbody>"]
    color = tint(SOURCE_COLORS["logits"], 0.45)
    for r in rows[:12]:
        cells = []
        for rank, (t, p) in enumerate(zip(r["row"], r["probs"] + [None] * len(r["row"]))):
            used = rank in grown.get(r["token"], set())
            style = f" style='background:{color}'" if used else ""
            pct = f" <small>{p:.0%}</small>" if p is not None and p >= 0 else ""
            cells.append(f"<span class='racer-cell'{style} title='rank {rank + 1}'>{_tok(decode, t)}{pct}</span>")
        out.append(f"<tr><td class='racer-rowtok'>{_tok(decode, r['token'])}</td><td>{r['breadth']}</td>"
                   f"<td>{''.join(cells) or '<i>empty</i>'}</td></tr>")
    if len(rows) > 12:
        out.append(f"<tr><td colspan='3' class='racer-muted'>… {len(rows) - 12} more rows</td></tr>")
    out.append("</tbody></table><div class='racer-muted'>Shaded: the entries the breadth let into the tree.</div></div>")
    return "".join(out)


def update_html(a: dict[str, Any], decode: Any) -> str:
    u = a.get("update") or {}
    parts = ["<div class='racer-rows'>"]
    wins = u.get("windows") or []
    if wins:
        parts.append("<table><thead><tr><th>n-gram inserted (ends at a committed token)</th><th></th></tr></thead><tbody>")
        for w in wins:
            parts.append(f"<tr><td class='racer-mono'>{html.escape(string_label(decode, w['tokens'], 60))}</td>"
                         f"<td>{'new nodes' if w['new'] else 'already stored: counted again'}</td></tr>")
        parts.append("</tbody></table>")
    ev = u.get("evicted") or []
    if ev:
        parts.append(f"<table><thead><tr><th>evicted leaves ({len(ev)}), least recently used first</th>"
                     "</tr></thead><tbody>")
        for e in ev[:12]:
            parts.append(f"<tr><td class='racer-mono'><s>{html.escape(string_label(decode, e['string'], 60))}</s></td>"
                         f"</tr>")
        if len(ev) > 12:
            parts.append(f"<tr><td class='racer-muted'>… {len(ev) - 12} more</td></tr>")
        parts.append("</tbody></table>")
    rows = [r for r in u.get("rows") or [] if r["old"] != r["new"]]
    if rows:
        parts.append("<table><thead><tr><th>copy-logit row of</th><th>before</th><th>after this step</th></tr>"
                     "</thead><tbody>")
        for r in rows[:10]:
            old = " ".join(_tok(decode, t, 8) for t in r["old"][:4]) or "<i>empty</i>"
            new = " ".join(_tok(decode, t, 8) for t in r["new"][:4])
            parts.append(f"<tr><td class='racer-rowtok'>{_tok(decode, r['token'])}</td><td>{old} …</td>"
                         f"<td>{new} …</td></tr>")
        parts.append("</tbody></table>")
    parts.append("</div>")
    return "".join(parts) if len(parts) > 2 else ""


def render_stage(stage: str, a: dict[str, Any], trace: Trace, *, width: int = 860, layer: int | None = None
                 ) -> StageView:
    decode = trace.decode_one
    title = STAGE_TITLES.get(stage, stage)
    if a.get("final"):
        return StageView(note_figure(title, "The last step commits the final token without a forward pass: pick an "
                                            "earlier step.", width=width))
    if stage == "match":
        m = a.get("match")
        second = None
        if m is not None and m.get("snapshot"):
            second = automaton_figure(m["snapshot"], decode, width=width,
                                      title="The automaton around the match state (before x0 is fed)")
        return StageView(match_figure(m, decode, width=width), second, borders_html(a, decode))
    if stage == "retrieval":
        return StageView(retrieval_candidates_figure(a.get("retrieval"), decode, root=a["root"], width=width))
    if stage == "logits":
        return StageView(logits_tree_figure(a.get("logits"), decode, root=a["root"], layer=layer, width=width),
                         html=logits_rows_html(a, decode))
    if stage == "merge":
        m = a["merge"]
        return StageView(merged_pool_figure(m, decode, width=width), sizer_figure(m, decode, width=width))
    if stage == "attention":
        return StageView(attention_mask_figure(a["attention"], decode, accepted=a["verify"]["accepted"], width=width))
    if stage == "verify":
        return StageView(verify_figure(a["verify"], decode, tree=a["attention"]["tree"], width=width))
    if stage == "update":
        u = a["update"]
        if u.get("snapshot"):
            fig = automaton_figure(u["snapshot"], decode, width=width,
                                   title="7 · The automaton after the update, around the new match state")
        else:
            fig = note_figure(title, "Retrieval is off in this run: only the copy-logit rows were updated.",
                              width=width)
        return StageView(fig, None, update_html(a, decode))
    raise ValueError(f"unknown stage {stage!r}")


def render_what_if(w: dict[str, Any], table: list[dict[str, Any]], trace: Trace, *, width: int = 860
                   ) -> tuple[go.Figure, go.Figure | None]:
    """The re-drafted tree with the path it would have accepted, and (greedy) the bar chart of
    what every variant in `table` would have committed (the first is the run's own draft)."""
    base = table[0]["variant"] if table else None
    tree = what_if_tree_figure(w, trace.decode_one, width=width, base=base)
    bars = what_if_figure(table, trace.decode_one, width=width) if table and table[0].get("committed") is not None \
        else None
    return tree, bars
