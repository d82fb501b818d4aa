"""Text and HTML the views show: stats lines, the step sentence, copy-logit rows, the legend,
the race verdict. Pure functions of plain data (no Gradio, no model)."""
from __future__ import annotations

import html
from statistics import median
from collections import Counter
from typing import Any, Callable, Iterable, Sequence

from racer import palette
from racer.race import BUSY_SHARE, PREFILL_SPREAD, SLOWED
from racer.sizing import DISTURBED
from racer.records import run_numbers
from visuals import method_color, token_sources
from visuals.colors import tint
from visuals.tokens import string_label, token_label, truncate, visible

METHOD_TITLES = {"racer": "RACER", "ar": "Plain autoregressive", "tr": "Token Recycling"}
METHOD_BLURBS = {
    "racer": "retrieval + copy-logit draft tree",
    "ar": "one token per forward pass",
    "tr": "copy-logit rows in a fixed 80-node template",
}
STOP_WORDS = {
    "eos": "finished (end of text)", "max_new_tokens": "finished (max new tokens)",
    "context_limit": "finished (context full)", "stopped": "stopped", "time_limit": "stopped (time limit)",
    "not_started": "not started",
}

# -- colours for coloured text --------------------------------------------------------------------

#: Source -> colour of coloured text: the shared colour code (racer.palette) as it is.
TEXT_COLORS: dict[str, str] = dict(palette.SOURCE_COLORS)
#: The model's own token is on every step: it stays nearly plain, a pale tint of the root grey
#: (as text background, faded for the other steps, and for the inspected step).
_ROOT_ALPHA, _ROOT_FADED_ALPHA, _ROOT_CURRENT_ALPHA = 0.18, 0.09, 0.66
#: Sources the race and the inspector can show, in legend order.
TEXT_SOURCES = ("root", "retrieval", "logits", "both", "lookup", "template")
CURRENT = "▶ "  # prefix of labels of the inspected step

_MD_SPECIAL = {c: f"&#{ord(c)};" for c in "\\`*_{}[]#|~<>&"}


def md_text(text: str) -> str:
    """Model text made safe inside Markdown: HTML and Markdown syntax shown literally."""
    return "".join(_MD_SPECIAL.get(ch, ch) for ch in text)


def text_color_map(current: bool = False) -> dict[str, str]:
    """Colour map for gr.HighlightedText (Gradio draws the background at 50 % alpha); with
    `current`, the other steps are faded and labels prefixed with CURRENT carry the full colour."""
    root = TEXT_COLORS["root"]
    if not current:
        return {k: (v if k != "root" else tint(root, _ROOT_ALPHA)) for k, v in TEXT_COLORS.items()}
    out = {k: (tint(v, 0.45) if k != "root" else tint(root, _ROOT_FADED_ALPHA)) for k, v in TEXT_COLORS.items()}
    out.update({CURRENT + k: (v if k != "root" else tint(root, _ROOT_CURRENT_ALPHA)) for k, v in TEXT_COLORS.items()})
    return out


def legend_html(sources: Sequence[str] = TEXT_SOURCES, extra: str = "") -> str:
    """The colour code as chips tinted like the text they explain, named in plain words."""
    chips = []
    for s in sources:
        c = TEXT_COLORS.get(s, "#999999")
        bg = tint(c, 0.5) if s != "root" else tint(c, _ROOT_ALPHA)
        chips.append(f'<span class="racer-chip" style="background:{bg}">'
                     f'{html.escape(palette.SOURCE_LONG_NAMES.get(s, s))}</span>')
    tail = f' <span class="racer-legend-note">{extra}</span>' if extra else ""
    return f'<div class="racer-legend" role="note" aria-label="colour code">{"".join(chips)}{tail}</div>'


# -- incremental coloured text (race columns) --------------------------------------------------------

class SpanBuilder:
    """Coloured spans of a growing token stream, decoded incrementally (a window of recent
    tokens keeps multi-byte characters and merged spaces right) so each update is O(new)."""

    def __init__(self, decode_many: Callable[[list[int]], str], colored: bool = True, window: int = 6) -> None:
        self.decode_many = decode_many
        self.colored = colored
        self.window = window
        self.ids: list[int] = []
        self.read = 0
        self.spans: list[tuple[str, str | None]] = []
        self._pending: list[str | None] = []

    def push_step(self, step: Any) -> None:
        labels = token_sources(step) if self.colored else [None] * len(step.committed)
        for tok, lab in zip(step.committed, labels):
            self._push(int(tok), lab)

    def _push(self, token: int, label: str | None) -> None:
        self.ids.append(token)
        self._pending.append(label)
        start = max(0, self.read - self.window)
        before = self.decode_many(self.ids[start:self.read]) if self.read > start else ""
        now = self.decode_many(self.ids[start:])
        if now.endswith("\ufffd"):
            return  # an incomplete character: wait for the next token
        text = now[len(before):]
        self.read = len(self.ids)
        lab = self._pending[-1]
        self._pending = []
        if not text:
            return
        if self.spans and self.spans[-1][1] == lab:
            self.spans[-1] = (self.spans[-1][0] + text, lab)
        else:
            self.spans.append((text, lab))

    @property
    def text(self) -> str:
        return "".join(t for t, _ in self.spans)


# -- race -------------------------------------------------------------------------------------------

#: What made a forward disturbed, in the words the page uses (racer.race: SLOWED, DISTURBED).
SLOWER = (f"took more than {SLOWED:g}× what such a forward takes on this machine when it is quiet "
          f"(or {DISTURBED:g}× the time its cost curve predicts for the tree size and context)")


def fmt_s(s: float) -> str:
    return f"{s:.2f} s" if s < 10 else f"{s:.1f} s"


def lane_stats_md(lane: Any, running: bool, series: Sequence[dict[str, Any]] | None = None) -> str:
    """One line of numbers under a race column: decoding only (its prefill is shown apart); with a
    finished `series` of races (see `race_record`), the median tokens/s over them with its range."""
    state = "running…" if running and not lane.done else STOP_WORDS.get(lane.stop_reason or "", lane.stop_reason or "")
    if not lane.started and running:
        state = "waiting for its turn"
    busy = ""
    pre_hit = lane.prefill_disturbed
    if lane.disturbed_steps or pre_hit:
        busy = f" · ⚠️ {lane.disturbed_steps} of {lane.checked_forwards} forwards disturbed"
        if pre_hit:
            busy += ", the prefill too"
        if lane.estimated_steps or pre_hit:
            busy += (f" (at wall time {fmt_s(lane.wall_compute_s)} decoding + {fmt_s(lane.prefill_s)} prefill)")
    out = (f"**{lane.n_tokens}** tokens · **{lane.forwards}** forwards · MAT **{lane.mat:.2f}**  \n"
           f"**{lane.tokens_per_s:.1f}** tok/s · {fmt_s(lane.compute_s)} decoding + "
           f"{fmt_s(lane.quiet_prefill_s)} prefill{busy} · *{state}*")
    xs = [r["lanes"][lane.method]["tokens_per_s"] for r in series or () if lane.method in r["lanes"]]
    if len(xs) > 1:
        out += f"  \nMedian of {len(xs)} races: **{median(xs):.1f}** tok/s ({min(xs):.1f}–{max(xs):.1f})"
    return out


def lane_header_html(method: str) -> str:
    c = method_color(method)
    return (f'<div class="racer-lane-head" style="border-color:{c}"><span class="racer-lane-dot" '
            f'style="background:{c}"></span><b>{METHOD_TITLES.get(method, method)}</b>'
            f'<span class="racer-lane-blurb">{METHOD_BLURBS.get(method, "")}</span></div>')


def race_plot_data(lanes: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """visuals.race_figure input from race lanes (x = each lane's own decoding time)."""
    key = {"tr": "token_recycling"}
    out = {}
    for m, ln in lanes.items():
        out[key.get(m, m)] = {"points": list(ln.points),
                              "final": {"tokens_per_s": ln.tokens_per_s, "mat": ln.mat}}
    return out


def race_speedups(lanes: dict[str, Any], prefill_s: float) -> dict[str, dict[str, float]]:
    """Per method, its speed-up over plain decoding: "decode" (decoding only, the prefill left out)
    and "total" (the whole request; `prefill_s`, the race's shortest prefill, bounds each lane's)."""
    ar = lanes.get("ar")
    out: dict[str, dict[str, float]] = {}
    if ar is None or ar.tokens_per_s <= 0:
        return out
    for m, ln in lanes.items():
        if m != "ar" and ln.tokens_per_s > 0:
            out[m] = {"decode": ln.tokens_per_s / ar.tokens_per_s,
                      "total": ln.total_tokens_per_s(prefill_s) / max(1e-12, ar.total_tokens_per_s(prefill_s))}
    return out


def race_record(lanes: dict[str, Any], prefill_s: float) -> dict[str, Any]:
    """What a series of races keeps of one race: plain numbers, not the lanes (which hold caches)."""
    ups = race_speedups(lanes, prefill_s)
    return {"prefill_s": prefill_s,
            "lanes": {m: {"tokens_per_s": ln.tokens_per_s, "total_tokens_per_s": ln.total_tokens_per_s(prefill_s),
                          "tokens": ln.n_tokens, "mat": ln.mat, "disturbed_steps": ln.disturbed_steps,
                          "estimated_steps": ln.estimated_steps, "checked_forwards": ln.checked_forwards}
                      for m, ln in lanes.items()},
            "speedups": ups}


def series_md(series: Sequence[dict[str, Any]], asked: int) -> str:
    """The verdict of a repeated race: per method, the median speed-up with its range."""
    def cell(m: str, kind: str) -> str:
        xs = [r["speedups"][m][kind] for r in series if m in r["speedups"]]
        if not xs:
            return f"{METHOD_TITLES.get(m, m)} –"
        return f"{METHOD_TITLES.get(m, m)} **{median(xs):.2f}×** ({min(xs):.2f}–{max(xs):.2f})"

    methods = list(dict.fromkeys(m for r in series for m in r["speedups"]))
    if not methods:
        return ""
    n = len(series)
    head = (f"**Median of {n} races** (range in brackets)" if n > 1 else "**1 race** finished")
    lines = [head + (f", {asked} were asked for" if n < asked else "")
             + ": speed-up over plain decoding, decoding time only: " + " · ".join(cell(m, "decode") for m in methods)
             + "; over the whole request: " + " · ".join(cell(m, "total") for m in methods) + "."]
    busy = sum(ln["disturbed_steps"] for r in series for ln in r["lanes"].values())
    if busy:
        of = sum(ln["checked_forwards"] for r in series for ln in r["lanes"].values())
        est = sum(ln.get("estimated_steps", 0) for r in series for ln in r["lanes"].values())
        lines.append(f"⚠️ Over the {n} races, {busy} of {of} forward passes {SLOWER}: other work shared the CPU"
                     + (f"; {est} of them were charged their quiet-machine estimate." if est else "."))
    return "  \n".join(lines)


def disturbed_md(lanes: dict[str, Any]) -> str:
    """The note under a race that ran while other work used the machine."""
    hit = {m: ln.disturbed_steps for m, ln in lanes.items() if ln.disturbed_steps}
    pre = [METHOD_TITLES.get(m, m) for m, ln in lanes.items() if ln.prefill_disturbed]
    pre_md = ""
    if pre:
        names = pre[0] if len(pre) == 1 else ", ".join(pre[:-1]) + " and " + pre[-1]
        pre_md = (f" The prefill of {names} took more than 1.5× what quiet races measured for it and was charged "
                  "that quiet estimate." if len(pre) == 1 else
                  f" The prefills of {names} took more than 1.5× what quiet races measured for them and were "
                  "charged that quiet estimate.")
    if not hit:
        return f"ℹ️{pre_md}" if pre else ""
    n = sum(hit.values())
    of = sum(ln.checked_forwards for ln in lanes.values())
    which = (f"{n} of {of} forward passes (" + ", ".join(f"{METHOD_TITLES.get(m, m)} {k}" for m, k in hit.items())
             + f") {SLOWER}")
    est = sum(ln.estimated_steps for ln in lanes.values())
    charged = ("Each was charged the time this machine takes for such a forward when quiet (the cost curve's "
               "time × the ratio to it that the method's forwards showed in recent quiet races), its whole step "
               "alike" + ("" if est == n else f" ({n - est} before any quiet time was known: at wall time)")
               + ". So the figures estimate a quiet machine" if est else
               "They are charged at wall time (no quiet forward has been measured yet to estimate them by)")
    if n < BUSY_SHARE * of:
        return f"ℹ️ {which}: a few hiccups like these are normal on a shared CPU. {charged}.{pre_md}"
    return (f"⚠️ **The machine was busy during this race**: {which}: other work (another visitor, another "
            f"program) shared the CPU. {charged}; wall time would favour the method with fewer forwards, "
            f"as every stall costs each forward alike.{pre_md} One race under load is less certain: tick "
            "*Race 3×* for the median and its range.")


def verdict_md(lanes: dict[str, Any], cmp: Any, greedy: bool, decode_many: Callable[[list[int]], str],
               stop_reason: str | None, chosen: str = "", prefill_s: float = 0.0) -> str:
    """The finish line: speedups over plain decoding and whether the outputs agree."""
    lines = []
    ups = race_speedups(lanes, prefill_s)
    if ups:
        parts = [f"**{METHOD_TITLES.get(m, m)} {u['decode']:.2f}×** (MAT {lanes[m].mat:.2f})" for m, u in ups.items()]
        lines.append("Speed-up over plain decoding, decoding time only (each method's own compute, the prefill "
                     "left out): " + " · ".join(parts) + ".")
        lines.append("Over the whole request (each method charged its own prefill, the same prompt read by "
                     f"all three, at most {PREFILL_SPREAD:g}× the shortest, {fmt_s(prefill_s)}: a longer one was slowed "
                     "by other work): "
                     + " · ".join(f"{METHOD_TITLES.get(m, m)} {u['total']:.2f}×" for m, u in ups.items()) + ".")
    busy = disturbed_md(lanes)
    if busy:
        lines.append(busy)
    if stop_reason == "stopped":
        lines.append("The race was stopped; the numbers cover what each method had produced by then.")
    elif stop_reason == "time_limit":
        lines.append("The race reached this server's time limit; the numbers cover what each method had produced.")
    if greedy:
        if cmp.identical and len(set(cmp.lengths.values())) <= 1:
            lines.append(f"✅ **Identical outputs**: all three methods produced the same {cmp.compared} tokens "
                         f"(greedy speculative decoding is lossless).")
        elif cmp.identical:
            lines.append(f"✅ **Identical so far**: the methods agree on all {cmp.compared} tokens they have in "
                         f"common (greedy speculative decoding is lossless).")
        else:
            shown = "; ".join(f"{METHOD_TITLES.get(m, m)} “{md_text(visible(decode_many(t)))}”"
                              for m, t in cmp.tokens_at_diff.items())
            lines.append(f"⚠️ **Outputs differ at token {cmp.first_diff}** (of {cmp.compared} compared): {shown}. "
                         f"Tiny numerical differences between a tree forward and a plain forward can flip a "
                         f"near-tie between two tokens.")
    else:
        lines.append("Sampling is on: each method draws an exact sample of the model's distribution, so the "
                     "texts need not match (they agree only in distribution).")
    if chosen:
        lines.append(chosen)
    return "\n\n".join(lines)


def sizing_md(steps: Iterable[Any], name: str = "RACER") -> str:
    """A line on automatic tree sizing, when the step records carry it (capacity = auto)."""
    chosen, cands, exp = [], [], []
    for st in steps:
        info = getattr(st, "info", None) or {}
        if info.get("chosen_T") is None:
            continue
        chosen.append(int(info["chosen_T"]))
        if info.get("candidates") is not None:
            cands.append(int(info["candidates"]))
        if info.get("expected_accept") is not None:
            exp.append(float(info["expected_accept"]))
    if not chosen:
        return ""
    mean = sum(chosen) / len(chosen)
    span = f" (from {min(chosen)} to {max(chosen)})" if min(chosen) != max(chosen) else ""
    out = (f"{name} sized its draft tree from this machine's cost curve: **{mean:.1f} nodes per step** on average"
           f"{span}")
    if cands:
        out += f", out of {sum(cands) / len(cands):.0f} candidates"
    if exp:
        out += f"; it expected {sum(exp) / len(exp):.2f} tokens per step"
    return out + "."


def find_cost_curve(steps: Iterable[Any]) -> dict[str, Any] | None:
    """A cost curve carried by step records (auto capacity), as `visuals.cost_figure` input."""
    for s in steps:
        info = getattr(s, "info", None) or {}
        for key in ("cost_curve", "curve", "sizing"):
            c = info.get(key)
            if isinstance(c, dict) and c.get("sizes") and c.get("ms"):
                out = dict(c)
                if "chosen_T" not in out and info.get("chosen_T") is not None:
                    out["chosen_T"] = info["chosen_T"]
                return out
    return None


# -- inspector -------------------------------------------------------------------------------------

def _q(text: str, n: int = 24) -> str:
    return "‘" + md_text(truncate(visible(text), n)) + "’"


def step_sentence(step: Any, decode_many: Callable[[list[int]], str], n_steps: int | None = None) -> str:
    """What happened in one step, in a sentence or two."""
    info = getattr(step, "info", None) or {}
    committed = list(step.committed)
    head = f"**Step {step.index + 1}{f' of {n_steps}' if n_steps else ''}.** "
    if not step.forwarded:
        return head + (f"No forward pass: the token the previous step fixed, {_q(decode_many(committed))}, "
                       f"is committed and the run ends.")
    parts = []
    if "n_retrieval" in info:
        borders = info.get("borders") or []
        n_r = int(info.get("n_retrieval", 0)) + int(info.get("n_both", 0))
        if borders:
            deepest = max(borders, key=lambda b: b.get("depth", 0))
            parts.append(f"retrieval's deepest border (an ending of the text + x0 seen before) is "
                         f"{_q(decode_many(list(deepest.get('tokens') or [])), 28)}, depth {deepest.get('depth', 0)}; "
                         f"it proposed {n_r} node{'s' * (n_r != 1)}")
        else:
            parts.append(f"retrieval found no earlier occurrence of the recent text followed by "
                         f"{_q(decode_many([int(step.root)]))}")
        chain = int(info.get("chain_len", 0) or 0)
        if chain:
            n_new = int(info.get("n_lookup", 0))
            parts.append(f"the prompt-lookup chain continued an earlier occurrence for {chain} "
                         f"token{'s' * (chain != 1)} ({n_new} not already proposed)")
        n_l = int(info.get("n_logits", 0))
        both = int(info.get("n_both", 0))
        parts.append(f"logits filled {n_l} node{'s' * (n_l != 1)}" + (f" ({both} proposed by both)" if both else ""))
    elif "template_nodes" in info:
        parts.append(f"the Token Recycling template placed {len(step.tree) - 1} nodes")
    if info.get("chosen_T") is not None:
        cand = info.get("candidates")
        exp = info.get("expected_accept")
        parts.append(f"the sizer kept {int(info['chosen_T'])} of {cand if cand is not None else '?'} candidate nodes"
                     + (f", expecting {float(exp):.2f} tokens" if exp is not None else ""))
    src = Counter(token_sources(step)[1:])
    acc = len(committed) - 1
    if acc:
        by = ", ".join(f"{n} from {s}" for s, n in src.most_common())
        parts.append(f"{acc} draft token{'s' * (acc != 1)} accepted ({by}) + the model's own token = "
                     f"{len(committed)} committed")
    else:
        parts.append(f"no draft accepted; the model's own token {_q(decode_many(committed[:1]))} is committed")
    text = "; ".join(parts)
    return head + text[:1].upper() + text[1:] + "."


def rows_html(step: Any, decode_one: Callable[[int], str], limit: int = 8) -> str:
    """The copy-logit rows this step's logits tree was read from. Entries on the accepted path
    are framed; entries that became tree nodes are coloured."""
    info = getattr(step, "info", None) or {}
    rows = info.get("copy_rows") or []
    if not rows:
        return ('<div class="racer-rows racer-muted">No copy-logit rows used in this step '
                '(no logits tree, or the step kept no picture data).</div>')
    tree = step.tree
    edges: dict[tuple[int, int], str] = {}
    for i in range(1, len(tree)):
        edges[(tree.tokens[tree.parents[i]], tree.tokens[i])] = tree.sources[i]
    acc_edges = set()
    path = [a for a in step.accepted[: len(step.committed)]]
    for a, b in zip(path, path[1:]):
        acc_edges.add((tree.tokens[a], tree.tokens[b]))
    out = ['<div class="racer-rows"><table><thead><tr><th>after token</th><th>its top next tokens '
           '(rank 1 → K), from the last logits computed after it</th></tr></thead><tbody>']
    for r in rows[:limit]:
        tok = int(r["token"])
        cells = []
        for rank, nxt in enumerate(r.get("row") or []):
            nxt = int(nxt)
            src = edges.get((tok, nxt))
            style = f"background:{tint(TEXT_COLORS[src], 0.45)};" if src in TEXT_COLORS else ""
            cls = "racer-cell acc" if (tok, nxt) in acc_edges else "racer-cell"
            cells.append(f'<span class="{cls}" style="{style}" title="rank {rank + 1}">'
                         f'{html.escape(truncate(token_label(decode_one, nxt), 12))}</span>')
        out.append(f'<tr><td class="racer-rowtok">{html.escape(truncate(token_label(decode_one, tok), 12))}</td>'
                   f'<td>{"".join(cells) or "<i>empty</i>"}</td></tr>')
    if len(rows) > limit:
        out.append(f'<tr><td colspan="2" class="racer-muted">… {len(rows) - limit} more rows</td></tr>')
    out.append("</tbody></table><div class='racer-muted'>Coloured: became a tree node (by source); "
               "framed: on the accepted path.</div></div>")
    return "".join(out)


def current_step_spans(spans: list[tuple[str, str | None]], step_of: list[int], k: int
                       ) -> list[tuple[str, str | None]]:
    """Relabel the spans of step `k` with the CURRENT prefix (see `text_color_map(current=True)`)."""
    out = []
    for (text, lab), s in zip(spans, step_of):
        if s == k and lab is not None:
            out.append((text, CURRENT + lab))
        else:
            out.append((text, lab))
    return out


def numbers_md(n: Any) -> str:
    """A run's counts in the words every view uses (racer.records.run_numbers)."""
    return (f"{n.tokens} tokens in {n.forwards} forward passes (the prompt's included): MAT **{n.mat:.2f}**, "
            f"{n.steps} steps")


def trace_header_md(trace: Any, limits_note: str = "") -> str:
    kind = {"race": "the last race's RACER column", "chat": "the last chat turn",
            "preset": "the preset run"}.get(trace.source, trace.source)
    if getattr(trace, "origin", "") == "shipped":
        kind = "a trace that ships with RACER Studio"
    elif getattr(trace, "origin", "") == "file":
        kind = "a loaded trace"
    parts = [f"Inspecting **{kind}**: {numbers_md(run_numbers(trace.steps))}"]
    if trace.title:
        parts[0] += f" — *{md_text(truncate(trace.title, 60))}*"
    if getattr(trace, "origin", "") and trace.model:
        parts.append(f"Recorded with {md_text(trace.model)}; the pictures and the anatomy replay the recording, "
                     f"no model runs.")
    if trace.truncated:
        parts.append(f"Pictures are kept for the first {trace.detail_steps} steps only (this server's limit); "
                     f"later steps show the text and the tree.")
    if limits_note:
        parts.append(limits_note)
    return "  \n".join(parts)


def bounded_label(decode_one: Callable[[int], str], tokens: Sequence[int], n: int = 30) -> str:
    return string_label(decode_one, tokens, n)
