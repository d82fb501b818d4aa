"""The words beside the anatomy's pictures: each stage of one step in plain language, with the
step's own numbers, and the answers of "what if" and "why was this token missed?".

Pure functions of the plain data `racer.anatomy` computes (no Gradio, no model)."""
from __future__ import annotations

from typing import Any, Callable

from visuals.tokens import truncate, visible

from .format import md_text
from .glossary import term

Decode = Callable[[Any], str]

STAGE_TITLES = {
    "match": "1 · Where are we? The match state and the borders",
    "retrieval": "2 · What followed before: retrieval candidates",
    "logits": "3 · What the model predicted before: the logits tree",
    "merge": "4 · One tree: the lookup chain, the merge and the sizer",
    "attention": "5 · One forward pass: tree attention",
    "verify": "6 · Verify: the model's own choice at every node",
    "update": "7 · Update: what the step teaches the drafter",
}


def q(decode: Decode, ids: Any, n: int = 28) -> str:
    """A token string quoted for Markdown: visible whitespace, cut to `n` cells."""
    ids = [ids] if isinstance(ids, int) else list(ids)
    return "‘" + md_text(truncate(visible("".join(decode(int(t)) for t in ids)), n)) + "’"


def _n(k: int, word: str, plural: str | None = None) -> str:
    return f"{k} {word if k == 1 else (plural or word + 's')}"


def match_md(a: dict[str, Any], decode: Decode) -> str:
    m = a.get("match")
    x0 = q(decode, a["root"], 14)
    if m is None:
        return (f"The model has just fixed the next token, x0 = {x0}. Retrieval is switched off for this run, so "
                f"there is no {term('automaton')} to match.")
    walk = m["walk"]
    fails = sum(1 for w in walk if w["move"] == "fail")
    arrival = m["arrival"]
    parts = [f"The model has just fixed the next token, **x0 = {x0}**. RACER's {term('automaton')} keeps every stretch "
             f"of up to {m['window']} tokens of the text so far ({m['size']:,} nodes of at most {m['capacity']:,}). "
             f"Its {term('match state')} is the last whole window it stored, {q(decode, m['state']['tokens'], 36)} "
             f"(depth {m['state']['depth']}): it ends the text, but never with x0, which is not fed yet."]
    if arrival["depth"] >= 1:
        parts.append(f"To append x0 it follows {_n(fails, term('failure link'))} (each jumps to the longest shorter "
                     f"ending of the text that is also stored) until it reaches a node that x0 can follow, and lands on "
                     f"{q(decode, arrival['tokens'], 36)} (depth {arrival['depth']}).")
    else:
        parts.append(f"It follows {_n(fails, term('failure link'))} down to the empty root: x0 was never seen before, "
                     f"so nothing can be retrieved.")
    b = m["borders"]
    if b:
        deep = b[0]
        parts.append(f"Every stored string of 2 or more tokens that ends the text + x0 is a **{term('border')}**: "
                     f"{_n(len(b), 'border')} here, the deepest {q(decode, deep['tokens'], 36)} (depth "
                     f"{deep['depth']}). Whatever followed them earlier is what retrieval proposes next.")
    else:
        parts.append(f"No stored string of 2 or more tokens ends the text + x0: **no {term('border')}**, so retrieval "
                     f"has nothing to propose at this step.")
    return " ".join(parts)


def retrieval_md(a: dict[str, Any], decode: Decode) -> str:
    r = a.get("retrieval")
    if r is None:
        return "Retrieval is switched off for this run."
    c = r["candidates"]
    if not c:
        return "No border, so no retrieval candidates at this step: the other sources fill the tree."
    kept = sum(1 for x in c if x["kept"])
    top = c[0]
    return (f"Below the borders the automaton holds what came next each earlier time. Pooled over all "
            f"borders and taken best first by how often they followed (their *frequency*): "
            f"**{_n(len(c), 'candidate')}**, the best {q(decode, top['token'], 14)} (seen {top['freq']}×). "
            f"{_n(kept, 'candidate')} survived the sizer (stage 4); the rest are drawn hollow.")


def logits_md(a: dict[str, Any], decode: Decode, layer: int | None = None) -> str:
    lg = a.get("logits")
    if lg is None:
        return "The logits tree is switched off for this run."
    nodes = lg["nodes"]
    if not nodes:
        return (f"{q(decode, a['root'], 14)} has no {term('copy-logit')} row yet (it was never fed to the model in this "
                f"text), so the logits tree is empty at this step.")
    sizes = [len(layer_) for layer_ in lg["layers"]]
    first = lg["rows"][0] if lg["rows"] else None
    rule = ("the paper's rule: x0's rank-1 entry may grow 8 children, rank 2 four, rank 3 two, then one each; "
            "below, breadth halves again at every rank" if lg["rule"] == "paper" else
            "the released code's rule: breadth halves at every rank, x0's children included (4, 2, 1, …)")
    kept = sum(1 for x in nodes if x["kept"])
    shown = f" Showing layers 1–{layer} of {len(sizes)}." if layer and layer < len(sizes) else ""
    if lg.get("cold"):
        start = (f"{q(decode, a['root'], 14)} was never fed to the model in this text, so it has no {term('copy-logit')} "
                 f"row. Its first layer comes from its **cold row** instead: the model's top {lg['k']} after this token "
                 f"alone, computed once per model for every token (a weaker guess, so the sizer learns it apart). "
                 f"Below, the tree reads the real rows of its tokens. The tree starts from that cold row")
    else:
        start = (f"The {term('copy-logit')} table keeps, for every token, the model's top {lg['k']} next tokens from the "
                 f"last time that token was fed. The tree starts from x0's row")
    return (start
            + (f" ({', '.join(q(decode, t, 8) for t in first['row'][:4])}, …)" if first and first["row"] else "")
            + f" and grows breadth first, {rule}. Layers: " + ", ".join(f"{s}" for s in sizes)
            + f" nodes ({len(nodes)} in all, until the budget is spent). {_n(kept, 'node')} survived the sizer."
            + shown)


#: racer.sizing.conf_bucket's buckets in words.
CONF_WORDS = {0: "under 30 %", 1: "30–60 %", 2: "60–90 %", 3: "90 % or more"}


def merge_md(a: dict[str, Any], decode: Decode) -> str:
    m = a["merge"]
    ch = m["chain"]
    parts = []
    if ch["match"] >= 0:
        if ch["tokens"] and ch.get("by_run"):
            parts.append(f"**{term('Prompt lookup')}** looks at the latest earlier places where the last {ch['match']} "
                         f"tokens and x0 occurred, takes the one whose text agrees furthest back "
                         f"({_n(int(ch.get('run', 0)), 'token')}) and copies what came next: "
                         f"{q(decode, ch['tokens'], 40)} ({_n(len(ch['tokens']), 'token')}).")
        elif ch["tokens"]:
            parts.append(f"**{term('Prompt lookup')}** finds the latest earlier place where the last {ch['match']} "
                         f"token{'s' * (ch['match'] != 1)} and x0 occurred and copies what came next: "
                         f"{q(decode, ch['tokens'], 40)} ({_n(len(ch['tokens']), 'token')}).")
        else:
            parts.append(f"{term('Prompt lookup')} finds no earlier occurrence of the last tokens and x0: no chain.")
    pool = m["pool"]
    n = len(pool["tokens"]) - 1
    srcs = pool["sources"][1:]
    counts = {s: srcs.count(s) for s in ("retrieval", "logits", "both", "lookup") if srcs.count(s)}
    parts.append(f"All candidates go into one trie, where shared beginnings merge (a node both retrieval and the "
                 f"logits tree proposed is *both*): **{_n(n, 'candidate')}** ("
                 + ", ".join(f"{v} {k}" for k, v in counts.items()) + ").")
    if m["auto"]:
        T = m["chosen_T"]
        e = m["expected_by_size"][T - 1] if T - 1 < len(m["expected_by_size"]) else m["expected"]
        ms = m["cost_ms"][T - 1] + m.get("overhead_ms", 0.0) if T - 1 < len(m["cost_ms"]) else None
        conf = CONF_WORDS.get(m.get("conf", -1))
        parts.append(f"The {term('sizer')} estimates for each how likely the model is to accept it (learned from the "
                     f"steps so far, by source, depth and rank"
                     + (f", and by how sure the model was of x0: {conf} here" if conf else "")
                     + f") and keeps the **{T} nodes** (root included) where expected tokens per second "
                     f"peak on this machine's {term('cost curve')}: **E = {e:.2f} tokens** per step"
                     + (f" for about {ms:.0f} ms" if ms else "") + "."
                     + (" (Kept to explore: nothing looked likely, and every 16th such step tries a few to "
                        "keep learning.)" if m.get("explore") else ""))
    else:
        parts.append(f"The {term('capacity')} is fixed at {m['capacity']} nodes, so the first {m['chosen_T']} are "
                     f"verified, likely or not.")
    return " ".join(parts)


def attention_md(a: dict[str, Any], decode: Decode) -> str:
    at = a["attention"]
    T = len(at["tree"]["tokens"])
    return (f"All **{_n(T, 'node')}** go through the model in **one forward pass** ({term('tree attention')}). "
            f"Node i sits at position {at['past']} + its depth and may look at the whole context ({at['past']} "
            f"tokens) and at its own ancestors only: the filled cells. Each branch is therefore scored exactly as "
            f"if it were the only continuation, and the model returns its choice after every node at once.")


def verify_md(a: dict[str, Any], decode: Decode) -> str:
    v = a["verify"]
    committed = v["committed"]
    acc = len(committed) - 1
    head = (f"From x0 the walk goes down while a child carries exactly the model's choice"
            + ("" if v["greedy"] else " (sampling: the model's draw at that node)") + ". ")
    if acc:
        head += f"Accepted: {q(decode, committed[1:], 40)} ({_n(acc, 'draft token')}). "
    else:
        head += "No draft matched. "
    last = q(decode, committed[-1], 14)
    reason = v["reason"]
    if reason == "mismatch":
        head += (f"At {last} the model wants {q(decode, v['wanted'], 14)}, which none of its "
                 f"{_n(len(v['children']), 'child', 'children')} carries: the walk stops. ")
    elif reason == "leaf":
        head += f"At {last} the tree ends (the model wants {q(decode, v['wanted'], 14)} next). "
    elif reason == "limit":
        head += "The run ended inside the accepted path (end of text or the new-token limit). "
    else:
        head += "The run ended after this step. "
    if reason in ("mismatch", "leaf"):
        head += "That token is not lost: it is the next step's root. "
    return head + f"**{_n(len(committed), 'token')} committed** with one forward pass."


def update_md(a: dict[str, Any], decode: Decode) -> str:
    u = a["update"]
    parts = []
    if "size_after" in u:
        new = sum(1 for w in u["windows"] if w["new"])
        parts.append(f"The {_n(len(u['windows']), 'committed token')} go into the automaton: "
                     f"{_n(len(u['windows']), 'window')} of up to its window length inserted ({new} with new nodes), "
                     f"{_n(u['touched'], 'node')} touched (marked as just used). It holds "
                     f"{u['size_before']:,} → {u['size_after']:,} nodes of {u['capacity']:,}.")
        ev = u.get("evicted") or []
        if ev:
            parts.append(f"It was full, so **{_n(len(ev), 'leaf', 'leaves')} were evicted**, least recently used "
                         f"first (e.g. {q(decode, ev[0]['string'], 28)}); inner nodes stay while they have children.")
        else:
            parts.append("Nothing was evicted (the automaton had room).")
    rows = u.get("rows") or []
    if rows:
        changed = sum(1 for r in rows if r["old"] != r["new"])
        parts.append(f"The {term('copy-logit')} rows of the {_n(len(rows), 'token')} in the verified tree were "
                     f"rewritten from this forward's predictions ({changed} changed).")
    return " ".join(parts) or "Nothing to update."


def stage_md(stage: str, a: dict[str, Any], decode: Decode, layer: int | None = None, title: bool = True) -> str:
    if a.get("final"):
        return ("This last step has no forward pass: the token the previous step fixed is committed and the "
                "run ends. Pick an earlier step to see its anatomy.")
    fn = {"match": match_md, "retrieval": retrieval_md, "merge": merge_md, "attention": attention_md,
          "verify": verify_md, "update": update_md}.get(stage)
    body = logits_md(a, decode, layer) if stage == "logits" else fn(a, decode)  # type: ignore[misc]
    return f"#### {STAGE_TITLES[stage]}\n\n{body}" if title else f"*At this step:* {body}"


# -- what if and why missed ----------------------------------------------------------------

def variant_label(v: dict[str, Any], run_capacity: str = "the run's") -> str:
    off = [name for name in ("retrieval", "logits", "lookup") if not v.get(name, True)]
    cap = v.get("capacity", "auto")
    bits = [("all sources" if not off else "without " + " and ".join(off))]
    bits.append(f"{run_capacity} size" if cap == "auto" else f"{cap} nodes")
    if v.get("breadth_rule", "paper") != "paper":
        bits.append("released breadth rule")
    return ", ".join(bits)


def what_if_md(w: dict[str, Any], decode: Decode) -> str:
    label = variant_label(w["variant"])
    if w.get("committed") is None:
        return (f"**{label}**: a tree of {w['nodes']} nodes. Under sampling its accepted length is not defined: "
                f"another tree would have met other random draws.")
    n, run = w["committed"], w["run_committed"]
    diff = ("the same as the run" if n == run else f"{n - run:+d} against the run's {run}")
    more = " (the recorded text ends there: it could have accepted more)" if w.get("limited") and w.get("ends") == "trace" \
        else ""
    return (f"**{label}**: a tree of {w['nodes']} nodes would have committed **{n} tokens** at this step, {diff}"
            f"{more}. Exact under greedy decoding: the model's tokens are known, so a tree's accepted length is its "
            f"longest root path that spells them.")


def what_if_table_md(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return ""
    greedy = rows[0].get("committed") is not None
    out = ["| the same step re-drafted … | nodes | " + ("tokens committed |" if greedy else "|"),
           "|---|---|---|"]
    for w in rows:
        c = w.get("committed")
        out.append(f"| {variant_label(w['variant'])} | {w['nodes']} | "
                   + (f"**{c}**" if c == max(r.get('committed') or 0 for r in rows) and greedy else str(c or "–"))
                   + " |")
    return "\n".join(out)


def why_missed_md(y: dict[str, Any] | None, decode: Decode) -> str:
    if y is None:
        return "Nothing was missed at this step: the run ended after it."
    w = q(decode, y["wanted"], 14)
    after = q(decode, y["after"], 14)
    parts = [f"**Why was {w} missed?** After {after} the model chose {w}, but the verified tree had no such node."]
    p = y.get("pool")
    if p is not None:
        if "order" in p:
            parts.append(f"It *was* a candidate ({p['source']}): the sizer rated it {p['order']}ᵗʰ most likely "
                         f"(P = {p['p_accept']:.2f}) and kept only {p['chosen_T'] - 1} draft nodes, so it was cut.")
        else:
            parts.append(f"It was a candidate ({p['source']}) but did not fit the fixed capacity.")
    r = y.get("retrieval")
    if r is not None:
        parts.append(f"Retrieval had it under a border, {r['rank'] + 1}ᵗʰ of {r['siblings']} by frequency (seen "
                     f"{r['freq']}×).")
    lg = y.get("logits")
    if lg is not None:
        parts.append(f"{after}'s {term('copy-logit')} row had it at rank {lg['rank'] + 1} of {lg['row_len']}"
                     + (f" (the model gave it {lg['prob']:.0%} then)" if lg.get("prob") is not None and lg["prob"] >= 0
                        else "") + ".")
    elif "logits_row" in y:
        parts.append(f"It is not in {after}'s copy-logit row" + (" (empty: never fed yet)" if not y["logits_row"]
                                                                  else "") + ".")
    if y.get("lookup"):
        parts.append("The prompt-lookup chain had it.")
    if not y.get("found"):
        parts.append("No source had it: the text never had it after these tokens and the model never ranked it in "
                     "its top tokens there — only the forward pass could find it.")
    cap = y.get("capacity_needed")
    if cap:
        parts.append(f"A tree of {cap} nodes would have drafted it.")
    elif y.get("found"):
        parts.append("Even 64 nodes would not have drafted it (it sits too deep or too far down the ranks).")
    return " ".join(parts)
