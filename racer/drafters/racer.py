"""The RACER drafter: a retrieval tree (Aho-Corasick automaton over the context) merged with
a logits tree (copy-logit rows), both in one draft trie of fixed capacity.

All state (automaton, copy-logit table) lives on the drafter object, i.e. in one session.
Nothing is module-level: two users of one process never see each other's text.

Merge planning (merge="merge"): retrieval candidates go in first, the logits tree fills what
is left. A logits node that repeats a retrieval node merges for free (source "both"), so the
logits tree is expanded with the full budget (capacity - 1, the tree it would build alone)
and inserted in BFS order until the draft is full; the union of the two is then at least
capacity - 1 nodes whenever the copy-logit table can fill that budget, so capacity is never
wasted on overlap. After the draft is full the rest of the expansion is still walked, but only
to mark nodes retrieval already proposed as "both" (new nodes, and their subtrees, are
skipped): the label then says what each source really proposed.

merge="half": retrieval may take (capacity - 1) // 2 nodes and the logits tree gets its own
fixed expansion of the rest; neither side gets what the other leaves unused, and overlap is
not refilled (that is the point of the ablation). merge="hard": the logits tree only when
retrieval proposes nothing.

lookup_chain (ours, not in the paper): the automaton's continuations end at its n-gram window
(a match of depth d proposes at most N - d tokens) and are ranked by frequency, so a long
passage the model is copying verbatim (code, extraction) is drafted a few tokens at a time.
With lookup_chain the draft also gets a prompt-lookup chain, merged into the same trie: the
continuation after an earlier occurrence of the last 3/2/1 tokens, up to `chain_len` tokens. Of
the last 3 tokens' latest occurrences it copies the one whose text agrees furthest back
(`chain_pick="run"`; prompt lookup copies the latest, `"recent"`), and where that agreement
reaches `long_run` tokens the chain runs to `long_chain`. Merged into the trie,
where it repeats a node already there, that node is marked `lookup=1`; the rest are new
"lookup" nodes. Where the matched occurrence is so recent that its continuation runs into the
present, the chain keeps repeating the text since the match (PLDDrafter's `periodic`); plain
prompt lookup would stop there. Whether the chain is worth verifying is left to tree sizing, which learns its
acceptance like any other source's; each chain node carries `run`, how far back the match agrees
with the text (PLDDrafter's `match_run`), which sizing reads. "racer-nochain" is the paper's drafter without it.

cold_rows (ours, not in the paper): a root the context has never fed has no copy-logit row, and
nothing else matches it either; with the model's cold rows (racer.coldrows, handed over by the
decode loop) its children come from what the model predicts after it alone. They are "logits"
nodes marked `cold=1`, which tree sizing learns apart.

`vocab_size` should be the model's logits width; the store grows if a larger id shows up.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any

import numpy as np

from ..automaton import Automaton, Continuations
from ..copylogit import RULES, CopyLogitStore, Expansion, write_tree_rows
from ..tree import DraftTree
from .base import Drafter, Verified
from .pld import PICKS, PLDDrafter

MERGES = ("merge", "half", "hard")
#: Most copy-logit rows listed in `tree.info["copy_rows"]` (pictures, not data).
MAX_COPY_ROWS = 12
#: A first-level copy-logit entry that is also among the top AGREE_TOP of the root's cold row.
AGREE_TOP = 3


@dataclass
class Draft:
    """One step's draft tree and the parts it was merged from (`RacerDrafter.draft`)."""
    tree: DraftTree
    #: The retrieval candidates from the borders' subtrees, and the tree node of each (-1: no room).
    continuations: Continuations | None = None
    placed: list[int] = field(default_factory=list)
    #: The prompt-lookup chain's tokens below the root, how many of them went in (their nodes),
    #: and the length of the n-gram it matched (0: none, -1: no chain asked for).
    chain: list[int] = field(default_factory=list)
    chain_nodes: list[int] = field(default_factory=list)
    chain_match: int = -1
    #: How far back the chain's occurrence agrees with the text, the root included (0: no chain),
    #: and whether it was chosen for that among several occurrences (else it is the latest).
    chain_run: int = 0
    chain_by_run: bool = False
    #: The copy-logit expansion, and the tree node of each of its nodes (-1: no room).
    expansion: Expansion | None = None
    logits_nodes: list[int] = field(default_factory=list)
    breakdown: dict[str, float] = field(default_factory=dict)


class RacerDrafter(Drafter):
    name = "racer"

    def __init__(self, vocab_size: int = 1, capacity_automaton: int = 10_000, window: int = 10,
                 topk: int = 8, breadth_rule: str = "paper", merge: str = "merge",
                 retrieval: bool = True, logits: bool = True, lookup_chain: bool = True, chain_len: int = 16,
                 chain_pick: str = "run", long_chain: int = 32, long_run: int = 16, row_probs: bool = True,
                 cold_rows: bool = True, cold_agree: bool = True, name: str | None = None) -> None:
        if breadth_rule not in RULES:
            raise ValueError(f"unknown breadth_rule {breadth_rule!r}; known: {RULES}")
        if merge not in MERGES:
            raise ValueError(f"unknown merge {merge!r}; known: {MERGES}")
        if chain_pick not in PICKS:
            raise ValueError(f"unknown chain_pick {chain_pick!r}; known: {PICKS}")
        if not (retrieval or logits):
            raise ValueError("RACER needs retrieval, logits or both")
        if name:
            self.name = name
        self.k = int(topk)
        self.breadth_rule = breadth_rule
        self.merge = merge
        self.retrieval = bool(retrieval)
        self.logits = bool(logits)
        self.wants_topk = self.k if self.logits else 0
        # The model's probability of each copy-logit entry, for tree sizing (ours, not in the
        # paper): "racer-ranks" leaves it out, so sizing sees ranks only.
        self.wants_topk_p = self.logits and bool(row_probs)
        self.automaton = Automaton(capacity=capacity_automaton, window=window)
        self.store = CopyLogitStore(vocab_size, self.k)
        # A root the context never fed has no copy-logit row; with the model's cold rows it
        # drafts from what the model predicts after it alone (racer.coldrows; ours, not in the paper).
        self.wants_cold_rows = self.logits and bool(cold_rows)
        self.cold_agree = bool(cold_agree)
        # The chain copies the occurrence that agrees furthest back, and runs to `long_chain`
        # tokens where that agreement is at least `long_run` (a passage being copied); both
        # measured in docs/PERFORMANCE.md §4.1, "The chain's source".
        self._chain = {"max_draft": chain_len, "periodic": True, "pick": chain_pick,
                       "long_draft": long_chain, "long_run": long_run}
        self.lookup = self.new_chain() if lookup_chain else None
        # How many context tokens the automaton has consumed, so `start` can catch up on
        # tokens committed without a verify step (e.g. a final pending root).
        self._fed = 0

    def new_chain(self) -> PLDDrafter:
        """A fresh prompt-lookup chain with this drafter's chain settings (whether or not it uses one)."""
        return PLDDrafter(**self._chain)

    def use_cold_rows(self, rows: Any) -> None:
        if self.wants_cold_rows:
            self.store.cold = rows

    def reset(self) -> None:
        self.automaton.reset()
        self.store.reset()
        if self.lookup is not None:
            self.lookup.reset()
        self._fed = 0

    # -- life cycle ----------------------------------------------------------------------

    def start(self, context: list[int], new_from: int, topk: np.ndarray | None,
              topk_p: np.ndarray | None = None) -> None:
        if self.retrieval:
            # Feed everything the automaton has not seen; if the context was rebuilt (not an
            # extension of what was fed), trust the caller's `new_from`.
            begin = self._fed if self._fed <= new_from else new_from
            self.automaton.feed(list(context[begin:]))
            self._fed = len(context)
        if self.logits and topk is not None and len(context) > new_from:
            self.store.write(np.asarray(context[new_from:], dtype=np.int64), topk, topk_p)
        if self.lookup is not None:
            self.lookup.start(context, new_from, topk)

    def draft(self, context: list[int], root: int, capacity: int) -> Draft:
        """The draft tree of at most `capacity` nodes and the parts it was merged from (what
        `propose` returns is its tree; the step inspector's anatomy shows the parts)."""
        tree = DraftTree.root_only(root)
        budget = max(0, int(capacity) - 1)
        both = self.retrieval and self.logits
        r_budget = budget // 2 if both and self.merge == "half" else budget
        d = Draft(tree)

        t0 = perf_counter()
        if self.retrieval and r_budget > 0:
            d.continuations = self.automaton.continuations(root, r_budget)
        t1 = perf_counter()
        if d.continuations is not None:
            d.placed = self._insert_retrieval(tree, d.continuations, 1 + r_budget)
        if self.lookup is not None and budget > 0:
            d.chain, d.chain_match, run = self.lookup.chain(context, root, budget)
            d.chain_run = run
            d.chain_by_run = self.lookup.by_run(d.chain_match)
            at = 0
            for tok in d.chain:
                if len(tree) > budget and tree.child(at, tok) < 0:
                    break  # full: the chain may only merge into what is there
                at = tree.add(at, tok, "lookup", 0, lookup=1, run=run)
                d.chain_nodes.append(at)
        t2 = perf_counter()

        if self.logits and budget > 0 and not (self.merge == "hard" and both and len(tree) > 1):
            l_budget = budget - r_budget if self.merge == "half" and both else budget
            d.expansion = self.store.expand(root, l_budget, self.breadth_rule)
            t3 = perf_counter()
            agree = ()
            if self.cold_agree and self.store.cold is not None and not d.expansion.cold:
                agree = self.store.cold.row(root, AGREE_TOP)[0]
            d.logits_nodes = self._insert_logits(tree, d.expansion, int(capacity), agree)
        else:
            t3 = perf_counter()
        t4 = perf_counter()
        d.breakdown = {"automaton_ms": (t1 - t0) * 1e3, "logits_ms": (t3 - t2) * 1e3,
                       "merge_ms": ((t2 - t1) + (t4 - t3)) * 1e3}
        return d

    def propose(self, context: list[int], root: int, capacity: int) -> DraftTree:
        d = self.draft(context, root, capacity)
        tree, cont = d.tree, d.continuations
        counts = Counter(tree.sources[1:])
        info: dict[str, Any] = {
            "match_depth": int(cont.match_depth) if cont is not None else 0,
            "borders": self._borders(cont),
            "n_retrieval": counts["retrieval"], "n_logits": counts["logits"], "n_both": counts["both"],
            "n_lookup": counts["lookup"], "chain_len": len(d.chain_nodes),
            "cold_root": bool(d.expansion is not None and d.expansion.cold),
            "capacity": int(capacity),
            "draft_breakdown": d.breakdown,
        }
        if self.detail:
            t = perf_counter()
            if self.retrieval:
                selected = set(cont.borders) if cont is not None else set()
                for i, node in enumerate(d.placed):
                    if node >= 0:
                        selected.update(cont.node_ids[i])
                info["automaton"] = self.automaton.snapshot(root, selected=selected)
            if d.expansion is not None:
                info["copy_rows"] = self._rows_used(root, d.expansion, [i for i, n in enumerate(d.logits_nodes)
                                                                        if n >= 0])
            info["picture_ms"] = (perf_counter() - t) * 1e3
        tree.info = info
        return tree

    def observe(self, step: Verified) -> dict[str, Any] | None:
        tree = step.tree
        if self.logits:
            write_tree_rows(self.store, tree.tokens, step.topk, step.accepted, step.topk_p)
        evicted: list[dict[str, Any]] = []
        if self.retrieval:
            self.automaton.feed(list(step.committed))
            self._fed += len(step.committed)
            evicted = [dict(e) for e in (self.automaton.last_evictions or [])]
        by_source = Counter(tree.sources[i] for i in step.accepted[1:])
        return {"evicted": evicted, "accepted_by_source": dict(by_source),
                "automaton_size": len(self.automaton) if self.retrieval else 0}

    # -- helpers ---------------------------------------------------------------------------

    @staticmethod
    def _insert_retrieval(tree: DraftTree, cont: Any, limit: int) -> list[int]:
        """Add the pooled continuations (topological, best first). Returns, per candidate,
        its tree node or -1 when it did not fit."""
        place: list[int] = []
        add = tree.add
        for tok, par, freq, bdepth, rank in zip(cont.tokens, cont.parents, cont.freqs,
                                                cont.border_depths, cont.ranks):
            at = 0 if par < 0 else place[par]
            if at < 0 or len(tree) >= limit:
                place.append(-1)
                continue
            place.append(add(at, tok, "retrieval", rank, freq=int(freq), border_depth=int(bdepth)))
        return place

    @staticmethod
    def _insert_logits(tree: DraftTree, exp: Expansion, limit: int, agree: Any = ()) -> list[int]:
        """Insert the expansion in BFS order while there is room, then only merge (see the
        module note). Returns, per expansion node, its tree node or -1 when it did not fit."""
        place: list[int] = []
        add, child = tree.add, tree.child
        for tok, par, rank, b, p in zip(exp.tokens, exp.parents, exp.ranks, exp.breadths, exp.probs):
            at = 0 if par < 0 else place[par]
            node = -1
            if at >= 0:
                if len(tree) < limit or child(at, tok) >= 0:
                    if par < 0 and exp.cold:  # sizing learns the cold row's acceptance apart
                        node = add(at, tok, "logits", rank, breadth=b, p_row=p, cold=1)
                    elif par < 0 and tok in agree:
                        node = add(at, tok, "logits", rank, breadth=b, p_row=p, agree=1)
                    else:
                        node = add(at, tok, "logits", rank, breadth=b, p_row=p)
            place.append(node)
        return place

    def _borders(self, cont: Any) -> list[dict[str, Any]]:
        if cont is None:
            return []
        out = []
        for b in cont.borders:
            s = [int(t) for t in self.automaton.node_string(b)]
            out.append({"node": int(b), "depth": len(s), "tokens": s})
        return out

    def _rows_used(self, root: int, exp: Expansion, inserted: list[int]) -> list[dict[str, Any]]:
        """The rows the inserted logits nodes were read from, root row first."""
        tokens = [int(root)]
        for i in inserted:
            p = exp.parents[i]
            if p >= 0:
                tokens.append(exp.tokens[p])
        tokens = list(dict.fromkeys(tokens))[:MAX_COPY_ROWS]
        return [{"token": t, "row": list(self.store.row(t))} for t in tokens]
