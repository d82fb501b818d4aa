"""Hardware-aware tree sizing: keep the part of the candidate tree that maximises expected
tokens per second, (1 + sum of P(node accepted)) / (t(T) + overhead).

P(node accepted) = product along its path of q = P(accepted | parent accepted), learned
online per session from what verification accepted, in buckets of what is known when
drafting (source, depth, rank, retrieval frequency share, border depth), backed off to a
coarser bucket and to priors while data is scarce.

Because P only falls along a path, the best ancestor-closed subset of size k is simply the k
nodes of highest P (ancestors first on ties), so sizing is a sort and a prefix sum.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable

from .tree import DraftTree

# Priors for q before any data: first-choice rows and retrieval hits are often right,
# lower ranks rarely (the paper: rank-1 copy-logit holds over half of the acceptances).
_PRIOR = {"retrieval": 0.55, "both": 0.65, "lookup": 0.55, "logits": 0.40, "template": 0.35}
_RANK_PRIOR = (1.0, 0.35, 0.2, 0.12, 0.08)
_DEEP_COPY = 0.85


@lru_cache(maxsize=None)  # called for every candidate node at every step; few distinct keys
def _prior(source: str, rank: int, depth: int = 1, burst: int = 0) -> float:
    # "retrieval+lookup" etc.: a node two sources proposed is at least as likely as either's.
    base = max(_PRIOR.get(s, 0.3) for s in source.split("+"))
    if source in ("logits", "template"):
        return base * _RANK_PRIOR[min(rank, len(_RANK_PRIOR) - 1)]
    if burst < 2:
        return base
    # Inside a copying stretch (the last step accepted 2+ drafts), once the first tokens of a
    # copy are accepted the next one usually is too: given its parent, q rises with depth.
    return base + (_DEEP_COPY - base) * (1.0 - 1.0 / depth)


@dataclass
class AcceptanceModel:
    """Beta-style counts per bucket with back-off: each bucket's estimate shrinks towards its
    coarser parent's, the coarsest towards the prior. Buckets, coarse to fine: (source, depth,
    rank); + burst, the bucketed accepted length of the previous step (acceptance comes in
    runs: copying stretches and free text); + retrieval frequency share and border depth."""
    #: Pseudo-counts of each level's parent estimate, coarse to fine.
    weights: tuple[float, ...] = (4.0, 4.0, 4.0)
    counts: dict[tuple, list[float]] = field(default_factory=dict)

    @staticmethod
    def features(tree: DraftTree, node: int, sibling_freq: dict[int, int], burst: int = 0) -> tuple[tuple, ...]:
        """Bucket keys from coarse to fine; each refines the one before it."""
        src = tree.sources[node]
        meta = tree.meta[node] if tree.meta else {}
        if meta.get("lookup") and src != "lookup":  # also on racer's prompt-lookup chain
            src += "+lookup"
        depth = min(tree.depths[node], 6)
        rank = min(tree.ranks[node], 4)
        share_b = bd_b = -1
        freq = meta.get("freq")
        if freq is not None:
            total = sibling_freq.get(tree.parents[node], 0) or 1
            share_b = min(int(4 * freq / total), 3)
            bd_b = min(int(meta.get("border_depth", 0)), 8) // 2
        coarse = (src, depth, rank)
        mid = coarse + (burst,)
        return coarse, mid, mid + (share_b, bd_b)

    def _sibling_freq(self, tree: DraftTree) -> dict[int, int]:
        out: dict[int, int] = {}
        for i in range(1, len(tree)):
            f = tree.meta[i].get("freq") if tree.meta else None
            if f:
                out[tree.parents[i]] = out.get(tree.parents[i], 0) + f
        return out

    def _q(self, keys: tuple[tuple, ...]) -> float:
        q = _prior(keys[0][0], keys[0][2], keys[0][1], keys[1][3])
        for key, weight in zip(keys, self.weights):
            a, n = self.counts.get(key, (0.0, 0.0))
            q = (a + weight * q) / (n + weight)
        return q

    def estimate(self, tree: DraftTree, burst: int = 0) -> list[float]:
        """P(node accepted) for every node (root = 1)."""
        sib = self._sibling_freq(tree)
        p = [1.0] * len(tree)
        for i in range(1, len(tree)):
            p[i] = p[tree.parents[i]] * self._q(self.features(tree, i, sib, burst))
        return p

    def update(self, tree: DraftTree, accepted: list[int], burst: int = 0) -> None:
        """Every child of an accepted node was tried; it succeeded if it is on the path."""
        on_path = set(accepted)
        sib = self._sibling_freq(tree)
        for i in range(1, len(tree)):
            if tree.parents[i] not in on_path:
                continue
            hit = 1.0 if i in on_path else 0.0
            for key in self.features(tree, i, sib, burst):
                c = self.counts.setdefault(key, [0.0, 0.0])
                c[0] += hit
                c[1] += 1.0


def choose_size(probs: list[float], cost_ms: Callable[[int], float], overhead_ms: float = 0.0,
                max_size: int | None = None) -> tuple[list[int], float, list[float]]:
    """Nodes to keep (ancestor-closed, root included), their expected committed tokens, and
    the expected tokens/ms for every size 1..n (for the cost-curve picture)."""
    n = len(probs) if max_size is None else min(len(probs), max_size)
    order = sorted(range(1, len(probs)), key=lambda i: (-probs[i], i))[: n - 1]
    best_k, best_rate, expected = 0, -1.0, 1.0
    rates = []
    running = 1.0
    for k in range(0, len(order) + 1):
        if k:
            running += probs[order[k - 1]]
        rate = running / (cost_ms(k + 1) + overhead_ms)
        rates.append(rate)
        if rate > best_rate:
            best_k, best_rate, expected = k, rate, running
    keep = sorted([0] + order[:best_k])
    return keep, expected, rates


def prune(tree: DraftTree, keep: list[int], probs: list[float] | None = None) -> DraftTree:
    """The sub-tree on `keep` (sorted, ancestor-closed), in the original order."""
    if len(keep) == len(tree):
        out = tree
    else:
        remap = {old: new for new, old in enumerate(keep)}
        out = DraftTree.root_only(tree.tokens[0])
        out.meta[0] = dict(tree.meta[0]) if tree.meta else {}
        for old in keep[1:]:
            parent = remap[tree.parents[old]]
            meta = dict(tree.meta[old]) if tree.meta else {}
            idx = out.add(parent, tree.tokens[old], tree.sources[old], tree.ranks[old], **meta)
            assert idx == remap[old]
        out.info = dict(tree.info)
    if probs is not None:
        for new, old in enumerate(keep):
            out.meta[new]["p_accept"] = round(probs[old], 4)
    return out


def burst_bucket(accepted_drafts: int) -> int:
    """0, 1, 2-3, 4+ draft tokens accepted in a step."""
    return 0 if accepted_drafts <= 0 else 1 if accepted_drafts == 1 else 2 if accepted_drafts <= 3 else 3


class Sizer:
    """Per-session sizing state: the acceptance model and the per-step overhead estimate."""

    def __init__(self, curve: Any, max_size: int | None = None, pool_factor: int = 2, burst: bool = True) -> None:
        self.curve = curve
        self.max_size = max_size or max(curve.sizes)
        # Drafters propose a larger pool than can be verified, so that learned acceptance (not
        # the drafter's fixed order, e.g. retrieval before logits) decides what fills the tree.
        self.pool_size = self.max_size * max(1, pool_factor)
        self.model = AcceptanceModel()
        self.overhead_ms = 1.0  # draft + acceptance + cache + update; tracked as a moving average
        # Without drafts nothing is learned: a drafter sized to zero by pessimistic priors would
        # stay there. Every `explore_every`-th undrafted step verifies the top few candidates.
        self.explore_every, self.explore_nodes = 16, 4
        self._idle = 0
        self.use_burst = burst
        self.burst = 0  # bucket of the previous step's accepted draft length

    def size(self, tree: DraftTree, context_len: int) -> DraftTree:
        probs = self.model.estimate(tree, self.burst)
        keep, expected, rates = choose_size(probs, lambda T: self.curve.t(T, context_len), self.overhead_ms,
                                            self.max_size)
        explore = False
        if len(keep) == 1 and len(tree) > 1:
            self._idle += 1
            if self._idle >= self.explore_every:
                self._idle, explore = 0, True
                top = sorted(range(1, len(probs)), key=lambda i: (-probs[i], i))[: self.explore_nodes]
                keep = sorted({0, *top})
                expected = 1.0 + sum(probs[i] for i in top)
        else:
            self._idle = 0
        out = prune(tree, keep, probs)
        out.info.update({"chosen_T": len(keep), "candidates": len(tree), "expected_accept": round(expected, 4),
                         "explore": explore, "burst": self.burst,
                         "rates": [round(r * 1e3, 3) for r in rates]})
        return out

    def observe(self, tree: DraftTree, accepted: list[int], timings: dict[str, float]) -> None:
        self.model.update(tree, accepted, self.burst)
        if self.use_burst:
            self.burst = burst_bucket(len(accepted) - 1)
        over = sum(v for k, v in timings.items() if k != "forward_ms")
        self.overhead_ms = 0.9 * self.overhead_ms + 0.1 * over
