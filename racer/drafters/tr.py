"""Token Recycling (Luo et al., 2024): the baseline RACER is compared against.

An adjacency matrix keeps, per token, the top-8 next tokens of the last logits computed after
it (the same table as RACER's copy-logit store). Each step a fixed 80-node template tree is
instantiated from the root: the node at template path p + [r] carries entry r of the row of
the token at p. The matrix is refreshed from every prefill position and from every verified
tree node, accepted or not, as in the TR paper.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from time import perf_counter
from typing import Any

import numpy as np

from ..copylogit import CopyLogitStore, write_tree_rows
from ..tree import DraftTree
from .base import Drafter, Verified

TEMPLATE_PATH = Path(__file__).resolve().parent.parent / "data" / "token_recycling_tree.json"


@lru_cache(maxsize=4)
def load_template(path: str | None = None) -> tuple[tuple[int, int], ...]:
    """The template as (parent template index or -1, rank) pairs in file order.

    The file lists paths of child ranks; a path's prefix must appear before it, which
    makes the file order topological (checked here rather than trusted)."""
    with open(path or TEMPLATE_PATH, encoding="utf-8") as f:
        paths = [tuple(int(r) for r in p) for p in json.load(f)["paths"]]
    index: dict[tuple[int, ...], int] = {}
    out = []
    for i, p in enumerate(paths):
        if not p or p in index:
            raise ValueError(f"template path {list(p)} is empty or repeated")
        parent = -1 if len(p) == 1 else index.get(p[:-1])
        if parent is None:
            raise ValueError(f"template path {list(p)} comes before its parent")
        index[p] = i
        out.append((parent, p[-1]))
    return tuple(out)


class TokenRecyclingDrafter(Drafter):
    name = "tr"

    def __init__(self, vocab_size: int = 1, topk: int = 8, template: str | None = None) -> None:
        self.k = int(topk)
        self.template = load_template(template)
        need = 1 + max(r for _, r in self.template)
        if need > self.k:
            raise ValueError(f"template uses rank {need - 1} but topk is {self.k}")
        self.wants_topk = self.k
        # Per-object state: two sessions never share an adjacency matrix.
        self.store = CopyLogitStore(vocab_size, self.k)

    def reset(self) -> None:
        self.store.reset()

    def start(self, context: list[int], new_from: int, topk: np.ndarray | None,
              topk_p: np.ndarray | None = None) -> None:
        if topk is not None and len(context) > new_from:
            self.store.write(np.asarray(context[new_from:], dtype=np.int64), topk)

    def propose(self, context: list[int], root: int, capacity: int) -> DraftTree:
        tree = DraftTree.root_only(root)
        row = self.store.row
        # Template index -> tree node, or -1 when skipped (empty row entry or no room).
        # A template node whose token repeats a sibling's maps onto that sibling (DraftTree.add
        # merges); its own template children then read the same row and merge as well, so the
        # merged subtree is exactly the first occurrence's template subtree.
        placed: list[int] = []
        for parent, r in self.template:
            at = 0 if parent < 0 else placed[parent]
            node = -1
            if at >= 0 and len(tree) < capacity:
                entries = row(tree.tokens[at])
                if r < len(entries):
                    node = tree.add(at, entries[r], "template", r)
            placed.append(node)
        tree.info = {"capacity": int(capacity), "template_nodes": len(self.template)}
        if self.detail:
            t0 = perf_counter()
            used = [tree.tokens[i] for i in dict.fromkeys(tree.parents[1:])][:12]
            tree.info["copy_rows"] = [{"token": t, "row": list(row(t))} for t in used]
            tree.info["picture_ms"] = (perf_counter() - t0) * 1e3
        return tree

    def observe(self, step: Verified) -> dict[str, Any] | None:
        write_tree_rows(self.store, step.tree.tokens, step.topk, step.accepted)
        return None
