"""Copy-logit store: per token id, the top-K next tokens seen the last time it was fed.

RACER's "unseen" signal (and Token Recycling's adjacency matrix) is a (V, K) table: row `t`
holds the K most likely next tokens of the logits produced right after the most recent
occurrence of token `t`. Rows cover the full output vocabulary (special tokens included) and
start empty (-1), so a token never fed does not expand into junk drafts.

`expand` grows a small tree breadth-first from a root with a halving breadth rule. It runs
on every decoding step, so it walks plain Python lists: a cached `.tolist()` row is an order
of magnitude cheaper than indexing numpy per node for trees of ~64 nodes.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .cpu.build import extension
from .cpu.switches import ON

RULES = ("paper", "released")


@dataclass
class Expansion:
    """A logits tree without its root, in BFS order. `parents[i]` is -1 for a child of the
    root, else an index into these lists (always < i)."""
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)       # position in the parent's row
    breadths: list[int] = field(default_factory=list)    # how many row entries the node may expand
    depths: list[int] = field(default_factory=list)      # 1 = child of the root
    probs: list[float] = field(default_factory=list)     # its probability in the parent's row; -1 unknown
    #: Whether the root had no row of its own and its children come from its cold row.
    cold: bool = False

    def __len__(self) -> int:
        return len(self.tokens)


class CopyLogitStore:
    """(V, K) int32 table of next-token ids, -1 = empty, and beside it the model's probability
    of each entry when the writer gave one (-1 where not): tree sizing learns acceptance per
    probability bucket, which separates a confident row from a flat one where ranks cannot."""

    def __init__(self, vocab_size: int, k: int = 8) -> None:
        if k < 1:
            raise ValueError("k must be >= 1")
        self.k = int(k)
        self.table = np.full((max(int(vocab_size), 1), self.k), -1, dtype=np.int32)
        self.probs = np.full(self.table.shape, -1.0, dtype=np.float32)
        # token -> its non-empty row (and its probabilities) as Python lists; dropped whenever
        # the row is rewritten.
        self._rows: dict[int, list[int]] = {}
        self._row_p: dict[int, list[float]] = {}
        #: The model's cold rows (racer.coldrows), read for a root that has no row of its own.
        self.cold: Any = None
        self._tensors: tuple[Any, ...] | None = None

    @property
    def vocab_size(self) -> int:
        return int(self.table.shape[0])

    def reset(self) -> None:
        self.table.fill(-1)
        self.probs.fill(-1.0)
        self._rows.clear()
        self._row_p.clear()

    def __len__(self) -> int:
        """Number of non-empty rows (for pictures and tests; O(V))."""
        return int(np.count_nonzero(self.table[:, 0] >= 0))

    def _grow(self, n: int) -> None:
        # Only reached when a caller under-sized the store (e.g. input ids beyond the logits
        # width): keep the data rather than drop rows or crash mid-generation.
        size = self.vocab_size
        while size < n:
            size *= 2
        extra = np.full((size - self.vocab_size, self.k), -1, dtype=np.int32)
        self.probs = np.concatenate([self.probs, extra.astype(np.float32)])
        self.table = np.concatenate([self.table, extra])

    def write(self, tokens: np.ndarray | list[int], topk: np.ndarray, probs: np.ndarray | None = None) -> None:
        """Set row `tokens[i]` to `topk[i]` (and its probabilities to `probs[i]`) for every i.
        For a token that occurs several times the last occurrence wins; negative ids are skipped,
        and so are positions whose row was not computed (all -1): the token keeps the row it has."""
        tokens = tokens.reshape(-1).tolist() if isinstance(tokens, np.ndarray) else [int(t) for t in tokens]
        arr = np.asarray(topk)
        made = (arr >= 0).any(axis=1).tolist() if arr.ndim == 2 and arr.shape[0] == len(tokens) \
            else [True] * len(tokens)  # a misshapen table: _put says what is wrong
        last: dict[int, int] = {}
        for i, t in enumerate(tokens):
            if t >= 0 and made[i]:
                last[t] = i
        self._put(last, topk, probs, len(tokens))

    def _put(self, last: dict[int, int], topk: np.ndarray, probs: np.ndarray | None, n: int) -> None:
        """Row `t` := `topk[last[t]]` for every token `t` in `last`. After every verify step this
        runs on a cold cache (the forward has just evicted it), so it makes as few numpy calls as
        it can: deduplicating with np.unique and masks cost 0.23 ms a step in decoding (0.05 ms
        when timed alone), this 0.12 (2-core EPYC, default model)."""
        topk = np.asarray(topk)
        if topk.ndim != 2 or topk.shape[0] != n:
            raise ValueError(f"topk must be ({n}, K), got {topk.shape}")
        if probs is not None:
            probs = np.asarray(probs)
            if probs.shape != topk.shape:
                raise ValueError(f"probs must have topk's shape {topk.shape}, got {probs.shape}")
        if not last:
            return
        toks = list(last)
        if max(toks) >= self.vocab_size:
            self._grow(max(toks) + 1)
        idx = list(last.values())
        w = min(self.k, topk.shape[1])
        rows = topk[idx, :w]
        if w == self.k:
            self.table[toks] = rows
        else:
            self.table[toks, :w] = rows
            self.table[toks, w:] = -1
        if probs is None:
            self.probs[toks] = -1.0
        else:
            self.probs[toks, :w] = np.where(rows >= 0, probs[idx, :w], -1.0)
            if w < self.k:
                self.probs[toks, w:] = -1.0
        self.forget(toks)

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The table and its probabilities as tensors sharing their memory (for racer's CPU kernel)."""
        t = self._tensors
        # The arrays are replaced only by `_grow`; `is` also catches a caller that swapped one.
        if t is None or t[2] is not self.table or t[3] is not self.probs:
            t = self._tensors = (torch.from_numpy(self.table), torch.from_numpy(self.probs), self.table, self.probs)
        return t[0], t[1]

    def forget(self, tokens: list[int]) -> None:
        """Drop the cached lists of rows that were rewritten."""
        cache = self._rows
        if cache:
            pop, pop_p = cache.pop, self._row_p.pop
            for t in tokens:
                pop(t, None)
                pop_p(t, None)

    def row(self, token: int) -> list[int]:
        """Non-empty entries of `token`'s row, best first (a cached list: do not mutate)."""
        r = self._rows.get(token)
        if r is None:
            if 0 <= token < self.table.shape[0]:
                r = [x for x in self.table[token].tolist() if x >= 0]
            else:
                r = []
            self._rows[token] = r
        return r

    def row_p(self, token: int) -> list[float]:
        """The probabilities of `row(token)`'s entries (-1 where none was written)."""
        p = self._row_p.get(token)
        if p is None:
            n = len(self.row(token))
            p = self.probs[token, :n].tolist() if n else []
            self._row_p[token] = p
        return p

    def expand(self, root: int, capacity: int, rule: str = "paper") -> Expansion:
        """BFS logits tree from `root` with at most `capacity` nodes (root excluded).

        Breadth rule: the root has breadth K; node i expands the first b_i entries of its row,
        and its j-th child (0-based) gets max(1, b_i >> (j + s)), where s = 1 below non-root
        nodes. The paper uses s = 0 at the root (children 8,4,2,1,...); the released code
        uses s = 1 there too (4,2,1,1,...). Empty rows simply do not expand, except the root's
        when cold rows are set: it then expands its cold row (`Expansion.cold`)."""
        if rule not in RULES:
            raise ValueError(f"unknown breadth rule {rule!r}; known: {RULES}")
        out = Expansion()
        if capacity <= 0:
            return out
        tokens, parents, ranks, breadths, depths = out.tokens, out.parents, out.ranks, out.breadths, out.depths
        probs = out.probs
        row, row_p = self.row, self.row_p
        root_shift = 0 if rule == "paper" else 1
        # (node index, token, breadth, depth, shift for its children)
        queue = deque([(-1, int(root), self.k, 0, root_shift)])
        n = 0
        while queue:
            idx, tok, b, d, s = queue.popleft()
            entries = row(tok)
            if entries:
                ps = row_p(tok)
            elif idx == -1 and self.cold is not None:
                entries, ps = self.cold.row(tok, self.k)
                out.cold = bool(entries)
            if not entries:
                continue
            for j, child in enumerate(entries[:b]):
                cb = b >> (j + s)
                if cb < 1:
                    cb = 1
                tokens.append(child)
                parents.append(idx)
                ranks.append(j)
                breadths.append(cb)
                depths.append(d + 1)
                probs.append(ps[j])
                queue.append((n, child, cb, d + 1, 1))
                n += 1
                if n >= capacity:
                    return out
        return out


def write_tree_rows(store: CopyLogitStore, tokens: list[int], topk: np.ndarray | None,
                    accepted: list[int], probs: np.ndarray | None = None) -> None:
    """Write the rows of every verified tree node. When a token sits at several nodes, the
    accepted node wins: its logits were computed on the real context, the others' on a
    prefix that was rejected, so it is the true "last time the token was fed"."""
    if topk is None or not tokens:
        return
    n = len(tokens)
    ops = _store_kernel()
    if ops is not None and max(tokens) < store.vocab_size:
        ids = np.asarray(topk)[:n]
        p = None if probs is None else np.asarray(probs)[:n]
        if ids.dtype == np.int64 and ids.ndim == 2 and ids.shape[0] == n and ids.flags.c_contiguous and (
                p is None or (p.dtype == np.float32 and p.shape == ids.shape and p.flags.c_contiguous)):
            t_table, t_probs = store.tensors()
            written = ops.write_store_rows(t_table, t_probs, tokens, accepted, torch.from_numpy(ids),
                                           None if p is None else torch.from_numpy(p))
            store.forget(written)
            return
    last: dict[int, int] = {}
    for i, t in enumerate(tokens):
        if t >= 0:
            last[t] = i
    for i in accepted:
        if 0 <= i < n and tokens[i] >= 0:
            last[tokens[i]] = i
    store._put(last, np.asarray(topk)[:n], None if probs is None else np.asarray(probs)[:n], n)


def _store_kernel() -> Any:
    """racer's CPU kernel that writes a verified tree's rows (csrc/store_rows.cpp), where it is
    built and RACER_ROW_KERNEL is not 0; else None (numpy writes them)."""
    return extension() if ON.rows else None
