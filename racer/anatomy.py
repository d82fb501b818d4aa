"""Anatomy of one RACER step, "what if" re-drafts and "why was this token missed", as plain data.

Everything here is computed from a replayed state (racer.replay): the drafter as it was just
before the step, the step's record, and what the run committed afterwards. Nothing runs the
model. The seven stages, in the order a step runs:

1. match      the context's last tokens, the automaton's match state, and how appending the
              root token x0 moves it along goto / failure links; the borders it lands on;
2. retrieval  the candidates pooled from the borders' subtrees, with their frequencies;
3. logits     the copy-logit rows read and the logits tree they grow, layer by layer;
4. merge      the prompt-lookup chain, the merged trie of all candidates, and the sizer's cut
              (expected tokens per second from the cost curve);
5. attention  the tree-attention mask of the verified tree and its position ids;
6. verify     the model's own top token at every node, and where the accepted path stopped;
7. update     n-grams inserted, nodes touched and evicted, copy-logit rows rewritten.

"What if": the same step re-drafted from the same state with sources switched off, another
capacity or the released breadth rule. Under greedy decoding the continuation is known (it is
what the run committed), so an alternative tree's accepted length is exactly its longest root
path that spells the actual next tokens; the one assumption is that a different tree would
not change the model's choice (floating-point near-ties aside, it does not). Under sampling
the accepted length of another tree is not defined (other random draws), and is not given.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .drafters.racer import Draft, RacerDrafter
from .replay import StepState, advance
from .records import StepRecord
from .sizing import prune, rank_by_chance
from .tree import DraftTree

STAGES = ("match", "retrieval", "logits", "merge", "attention", "verify", "update")
#: Context tokens shown before the tree in the attention mask (the rest are one column).
MASK_TAIL = 6
#: Capacities the "what if" view offers beside the run's own ("auto" or the fixed one).
WHAT_IF_CAPACITIES = (8, 16, 64)


def racer_of(state: StepState) -> RacerDrafter:
    d = state.drafter
    if not isinstance(d, RacerDrafter):
        raise TypeError(f"the anatomy explains RACER steps; this trace's drafter is {getattr(d, 'name', d)!r}")
    return d


def continuation(steps: list[StepRecord], k: int) -> tuple[list[int], str]:
    """The tokens the run committed from step k's root on, and why they end there: "end" (the
    run ended: end of text, max new tokens, stopped) or "trace" (the trace was cut short)."""
    seq = [int(t) for s in steps[k:] for t in s.committed]
    last = steps[-1] if steps else None
    return seq, ("end" if last is None or last.next_root is None else "trace")


def accepted_length(tree: DraftTree, seq: list[int]) -> tuple[int, list[int]]:
    """Committed tokens a step with `tree` would give when the model's tokens are `seq` (seq[0]
    is the root): the longest root path spelling seq, counted with the root; and that path."""
    node, path = 0, [0]
    while len(path) < len(seq):
        c = tree.child(node, seq[len(path)])
        if c < 0:
            break
        node = c
        path.append(c)
    return len(path), path


def _node_path(tree: DraftTree, tokens: list[int]) -> int:
    """The node of `tree` spelling `tokens` below its root, or -1."""
    node = 0
    for t in tokens:
        node = tree.child(node, int(t))
        if node < 0:
            return -1
    return node


def _kept_nodes(pool: DraftTree, sized: DraftTree) -> list[int]:
    """Per pool node, its node in the sized tree (-1: cut). Sizing keeps an ancestor-closed
    subset with the same tokens, so nodes map by their token paths."""
    out = [0] + [-1] * (len(pool) - 1)
    for i in range(1, len(pool)):
        p = out[pool.parents[i]]
        out[i] = sized.child(p, pool.tokens[i]) if p >= 0 else -1
    return out


# -- stage 1: the match --------------------------------------------------------------------

def match_stage(d: RacerDrafter, root: int) -> dict[str, Any] | None:
    if not d.retrieval:
        return None
    a = d.automaton

    def node(v: int) -> dict[str, Any]:
        return {"node": v, "tokens": a.node_string(v), "depth": a.depth(v), "freq": a.freq(v)}

    s = a.state
    walk = [dict(node(s), move="state")]
    # The Aho–Corasick step for x0: follow failure links down from the state until a node has
    # an x0 edge (the state itself is the last whole window inserted, of depth `window`: it
    # never has one, so the first move is always a failure link).
    while s != 0 and a.child(s, root) < 0:
        s = a.fail(s)
        walk.append(dict(node(s), move="fail"))
    arrival = a.child(s, root)
    if arrival >= 0:
        walk.append(dict(node(arrival), move="goto"))
    else:
        arrival = 0
    borders = a.peek_borders(root)
    chain = []
    v = arrival
    while v > 0:
        if a.depth(v) >= 2:
            chain.append(v)
        v = a.fail(v)
    return {"context_tail": a.context_tail, "root": int(root), "state": node(a.state), "walk": walk,
            "snapshot": a.snapshot(root, selected=set(borders)),
            "arrival": node(arrival), "borders": [dict(node(b), children=len(a.children(b))) for b in borders],
            # The borders are exactly the arrival and its failure chain (depth >= 2).
            "arrival_chain": chain, "window": a.window, "size": len(a), "capacity": a.capacity,
            "clock": a.step}


# -- stage 2: retrieval --------------------------------------------------------------------

def retrieval_stage(d: RacerDrafter, draft: Draft, kept: list[int]) -> dict[str, Any] | None:
    cont = draft.continuations
    if not d.retrieval:
        return None
    if cont is None:
        return {"candidates": [], "borders": []}
    a = d.automaton
    border_of: list[int] = []
    depth_rel: list[int] = []
    for i in range(len(cont)):
        rel = 1 if cont.parents[i] < 0 else depth_rel[cont.parents[i]] + 1
        depth_rel.append(rel)
        # The deepest border whose subtree holds this candidate.
        best = -1
        for v in cont.node_ids[i]:
            b = v
            for _ in range(rel):
                b = a.parent(b)
            if best < 0 or a.depth(b) > a.depth(best):
                best = b
        border_of.append(best)
    cands = []
    for i in range(len(cont)):
        node = draft.placed[i] if i < len(draft.placed) else -1
        cands.append({"token": cont.tokens[i], "parent": cont.parents[i], "freq": cont.freqs[i],
                      "rank": cont.ranks[i], "depth": depth_rel[i], "border": border_of[i],
                      "border_depth": cont.border_depths[i], "node": node,
                      "kept": node >= 0 and kept[node] >= 0})
    return {"candidates": cands, "borders": [{"node": b, "tokens": a.node_string(b), "depth": a.depth(b),
                                              "freq": a.freq(b)} for b in cont.borders]}


# -- stage 3: logits -----------------------------------------------------------------------

def logits_stage(d: RacerDrafter, draft: Draft, root: int, kept: list[int]) -> dict[str, Any] | None:
    if not d.logits:
        return None
    exp = draft.expansion
    nodes = []
    if exp is not None:
        for i in range(len(exp)):
            node = draft.logits_nodes[i] if i < len(draft.logits_nodes) else -1
            nodes.append({"token": exp.tokens[i], "parent": exp.parents[i], "rank": exp.ranks[i],
                          "breadth": exp.breadths[i], "depth": exp.depths[i], "prob": exp.probs[i], "node": node,
                          "kept": node >= 0 and kept[node] >= 0})
    # The rows read, in the order the expansion read them (the root's first), each with how
    # many of its entries the node's breadth let in.
    rows = []
    seen = set()
    readers = [(-1, int(root), d.k, 0)] + [(i, n["token"], n["breadth"], n["depth"]) for i, n in enumerate(nodes)]
    for i, tok, b, depth in readers:
        if tok in seen:
            continue
        seen.add(tok)
        row, probs = d.store.row(tok), d.store.row_p(tok)
        if i < 0 and exp is not None and exp.cold:  # a novel root: its cold row (racer.coldrows)
            row, probs = d.store.cold.row(tok, d.k)
        if i >= 0 and not any(n["parent"] == i for n in nodes):
            continue  # never expanded (the budget ran out first)
        rows.append({"token": tok, "row": list(row), "probs": [round(p, 4) for p in probs],
                     "breadth": b, "depth": depth})
    layers: dict[int, list[int]] = {}
    for i, n in enumerate(nodes):
        layers.setdefault(n["depth"], []).append(i)
    return {"nodes": nodes, "rows": rows, "layers": [layers[k] for k in sorted(layers)], "rule": d.breadth_rule,
            "k": d.k, "merge": d.merge, "cold": bool(exp is not None and exp.cold)}


# -- stage 4: chain, merge and size --------------------------------------------------------

def merge_stage(state: StepState, draft: Draft, sized: DraftTree, kept: list[int], plan: Any) -> dict[str, Any]:
    pool = draft.tree
    out: dict[str, Any] = {
        "chain": {"tokens": [int(t) for t in draft.chain], "nodes": list(draft.chain_nodes), "match": draft.chain_match,
                  "run": draft.chain_run, "by_run": draft.chain_by_run},
        "pool": pool.to_dict(), "lookup": [bool(m.get("lookup")) for m in pool.meta],
        "kept": kept, "capacity": state.step.capacity, "chosen_T": len(sized), "auto": plan is not None,
    }
    if plan is not None:
        out.update({"p_accept": [round(p, 4) for p in plan.probs], "expected_by_size": plan.expected_by_size,
                    "cost_ms": plan.costs, "rates": plan.rates, "expected": plan.expected, "explore": plan.explore,
                    "overhead_ms": state.sizer.overhead_ms if state.sizer is not None else 0.0,
                    # What the acceptance buckets knew of the steps before: the last step's accepted
                    # length and how sure the model was of x0 (racer.sizing's burst and conf buckets).
                    "burst": state.sizer.burst if state.sizer is not None else 0,
                    "conf": state.sizer.conf if state.sizer is not None else -1})
    return out


# -- stage 5: tree attention ---------------------------------------------------------------

def attention_stage(rec: StepRecord, context: list[int], tail: int = MASK_TAIL) -> dict[str, Any]:
    tree = rec.tree
    past = rec.context_len
    anc = tree.ancestor_matrix()
    return {"past": past, "tail": [int(t) for t in context[max(0, past - tail):past]],
            "tree": tree.to_dict(), "positions": [past + d for d in tree.depths],
            "ancestors": anc.astype(int).tolist()}


# -- stage 6: verify -----------------------------------------------------------------------

def verify_stage(rec: StepRecord, greedy: bool) -> dict[str, Any]:
    tree = rec.tree
    top = [int(r[0]) for r in rec.topk] if rec.topk is not None else None
    path = list(rec.verified_path or rec.accepted)
    cut = len(rec.committed) < len(path)
    last = path[len(rec.committed) - 1] if rec.committed else 0
    wanted = rec.next_root
    if wanted is None and top is not None and not cut:
        wanted = top[last]
    kids = [i for i in range(1, len(tree)) if tree.parents[i] == last]
    if cut:
        reason = "limit"        # the run ended inside the accepted path (end of text or max new tokens)
    elif rec.next_root is None:
        reason = "end"          # the run ended after this step
    elif not kids:
        reason = "leaf"
    else:
        reason = "mismatch"
    # The token the model chose at each node of the accepted path: the next node's, then the
    # next root (greedy: its top token; sampling: its draw).
    chosen = {a: tree.tokens[b] for a, b in zip(path, path[1:])}
    if rec.next_root is not None and not cut:
        chosen[path[-1]] = rec.next_root
    return {"model_top": top, "chosen": {str(k): v for k, v in chosen.items()},
            "accepted": path[:len(rec.committed)], "last": last, "wanted": wanted,
            "children": [tree.tokens[i] for i in kids], "reason": reason, "greedy": greedy,
            "committed": list(rec.committed)}


# -- stage 7: update -----------------------------------------------------------------------

def update_stage(state: StepState, draft: Draft) -> dict[str, Any]:
    """Replays the step's update on the state (the state moves past this step)."""
    d = racer_of(state)
    rec = state.step
    a = d.automaton if d.retrieval else None
    before_size = len(a) if a is not None else 0
    windows = []
    if a is not None:
        ctx = list(state.context)
        for t in rec.committed:
            ctx.append(int(t))
            w = ctx[-a.window:]
            windows.append({"tokens": w, "new": a.find(w) < 0})
    tokens = sorted(set(int(t) for t in rec.tree.tokens)) if rec.topk is not None and d.logits else []
    old = {t: list(d.store.row(t)) for t in tokens}
    clock = a.step if a is not None else 0
    advance(state.drafter, state.sizer, rec, state.context, pool=draft.tree)
    rows = [{"token": t, "old": old[t], "new": list(d.store.row(t)),
             "accepted": any(rec.tree.tokens[i] == t for i in rec.accepted)} for t in tokens]
    out: dict[str, Any] = {"windows": windows, "rows": rows}
    if a is not None:
        touched = sum(1 for v in range(1, len(a) + 1) if a.last_touch(v) == a.step)
        out.update({"evicted": [dict(e, string=list(e["string"])) for e in a.last_evictions or []],
                    "size_before": before_size, "size_after": len(a), "capacity": a.capacity,
                    "touched": touched, "clock": [clock, a.step], "state": a.node_string(a.state),
                    # The neighbourhood of the new match state, this step's evictions listed.
                    "snapshot": a.snapshot(None)})
    return out


# -- the whole step ------------------------------------------------------------------------

def anatomy(state: StepState, greedy: bool = True) -> dict[str, Any]:
    """Every stage of `state`'s step (see the module doc). Leaves the state after the step."""
    d = racer_of(state)
    rec = state.step
    if not rec.forwarded:
        return {"final": True, "step": state.k, "root": rec.root}
    draft = d.draft(state.context, rec.root, rec.capacity or 1)
    plan = state.sizer.plan(draft.tree, len(state.context)) if state.sizer is not None else None
    sized = prune(draft.tree, plan.keep) if plan is not None else draft.tree
    kept = _kept_nodes(draft.tree, sized)
    out = {"final": False, "step": state.k, "root": rec.root,
           "match": match_stage(d, rec.root),
           "retrieval": retrieval_stage(d, draft, kept),
           "logits": logits_stage(d, draft, rec.root, kept),
           "merge": merge_stage(state, draft, sized, kept, plan),
           "attention": attention_stage(rec, state.context),
           "verify": verify_stage(rec, greedy)}
    out["update"] = update_stage(state, draft)
    return out


# -- what if ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Variant:
    retrieval: bool = True
    logits: bool = True
    lookup: bool = True
    capacity: int | str = "auto"      # "auto" = the run's own sizing (or its fixed capacity)
    breadth_rule: str = "paper"


def redraft(state: StepState, v: Variant) -> DraftTree:
    """Step `state` re-drafted as `v` asks, from the same state; the state is left as it was
    (the drafter's switches are restored; the sizer is asked, never told)."""
    d = racer_of(state)
    saved = (d.retrieval, d.logits, d.lookup, d.breadth_rule)
    rec = state.step
    try:
        d.retrieval, d.logits, d.breadth_rule = v.retrieval, v.logits, v.breadth_rule
        if not v.lookup:
            d.lookup = None
        elif d.lookup is None:
            # The run had no chain (racer-nochain): the one racer's default would have had.
            d.lookup = d.new_chain()
        if v.capacity == "auto":
            pool = d.draft(state.context, rec.root, rec.capacity or 1).tree
            if state.sizer is None:
                return pool
            return prune(pool, state.sizer.plan(pool, len(state.context)).keep)
        return d.draft(state.context, rec.root, int(v.capacity)).tree
    finally:
        d.retrieval, d.logits, d.lookup, d.breadth_rule = saved


def what_if(state: StepState, steps: list[StepRecord], v: Variant, greedy: bool = True) -> dict[str, Any]:
    """The step re-drafted as `v`, and (greedy) how many tokens it would have committed."""
    tree = redraft(state, v)
    out: dict[str, Any] = {"variant": dataclasses.asdict(v), "tree": tree.to_dict(),
                           "nodes": len(tree), "run_committed": len(state.step.committed)}
    if not greedy:
        out.update({"committed": None, "path": [], "note": "sampling"})
        return out
    seq, why = continuation(steps, state.k)
    n, path = accepted_length(tree, seq)
    out.update({"committed": n, "path": path, "limited": n == len(seq), "ends": why})
    return out


def variant_of_run(state: StepState) -> Variant:
    """The variant that reproduces the run's own draft (a check: its what-if is the run)."""
    d = racer_of(state)
    return Variant(d.retrieval, d.logits, d.lookup is not None, "auto", d.breadth_rule)


# -- why was this token missed? -----------------------------------------------------------

def why_missed(state: StepState, steps: list[StepRecord]) -> dict[str, Any] | None:
    """Where the model's own token after the accepted path (the next root) was among the
    drafter's sources at this step, and whether a larger tree would have drafted it. None when
    nothing was missed (the run ended after this step)."""
    d = racer_of(state)
    rec = state.step
    if not rec.forwarded or rec.next_root is None:
        return None
    wanted = int(rec.next_root)
    prefix = [int(t) for t in rec.committed[1:]]      # accepted draft tokens, below the root
    target = prefix + [wanted]
    out: dict[str, Any] = {"wanted": wanted, "after": int(rec.committed[-1]), "prefix": prefix}
    big = d.draft(state.context, rec.root, max(rec.capacity or 1, 1024))
    pool = d.draft(state.context, rec.root, rec.capacity or 1).tree
    node = _node_path(pool, target)
    if node >= 0:
        entry: dict[str, Any] = {"source": pool.sources[node], "rank": pool.ranks[node]}
        if state.sizer is not None:
            plan = state.sizer.plan(pool, len(state.context))
            entry["p_accept"] = round(plan.probs[node], 4)
            entry["order"] = 1 + rank_by_chance(plan.probs).index(node)
            entry["chosen_T"] = len(plan.keep)
        out["pool"] = entry
    # Retrieval: a continuation under a border that spells the path.
    cont = big.continuations
    if cont is not None:
        idx = -1
        at = -1
        for t in target:
            nxt = -1
            for i in range(len(cont)):
                if cont.parents[i] == at and cont.tokens[i] == t:
                    nxt = i
                    break
            if nxt < 0:
                break
            at = nxt
        else:
            idx = at
        if idx >= 0:
            a = d.automaton
            out["retrieval"] = {"rank": cont.ranks[idx], "freq": cont.freqs[idx],
                                "border_depth": cont.border_depths[idx],
                                "siblings": sum(1 for p in cont.parents if p == cont.parents[idx]),
                                "borders": [a.node_string(b) for b in cont.borders]}
    # Copy-logit: the row of the last committed token.
    if d.logits:
        row = list(d.store.row(int(rec.committed[-1])))
        if wanted in row:
            r = row.index(wanted)
            p = d.store.row_p(int(rec.committed[-1]))
            out["logits"] = {"rank": r, "prob": round(p[r], 4) if r < len(p) else None, "row_len": len(row)}
        else:
            out["logits_row"] = row
    # The lookup chain.
    if d.lookup is not None and big.chain[:len(target)] == target:
        out["lookup"] = {"position": len(target)}
    # Would a larger tree have had it? The run's pool at 64 nodes (no sizing).
    for cap in WHAT_IF_CAPACITIES:
        t = d.draft(state.context, rec.root, cap).tree
        if _node_path(t, target) >= 0:
            out["capacity_needed"] = cap
            break
    out["found"] = any(k in out for k in ("pool", "retrieval", "logits", "lookup"))
    return out
