"""The draft tree: candidate tokens rooted at the token the model has just fixed.

Nodes are kept in topological order (a parent always precedes its children), so the
verification forward can feed them as one sequence. Every node remembers where it came
from (`source`) and its rank in the row that proposed it, so pictures can explain it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np
import torch

#: Where a node came from. "both" = proposed by retrieval and by the logits tree.
SOURCES = ("root", "retrieval", "logits", "both", "template", "lookup")


def _to(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """`t` on `device`; to an accelerator through pinned memory without blocking the host (a copy
    from pageable memory would wait for the device's queue, a hidden synchronisation)."""
    device = torch.device(device)
    if device.type == "cpu":
        return t
    return t.pin_memory().to(device, non_blocking=True)


@dataclass
class DraftTree:
    tokens: list[int]
    parents: list[int]
    sources: list[str]
    ranks: list[int]
    depths: list[int]
    #: Optional per-node extras for pictures (e.g. {"freq": 3, "breadth": 4}).
    meta: list[dict[str, Any]] = field(default_factory=list)
    #: Drafter-specific data about how the tree was built (borders, snapshot, counts...).
    info: dict[str, Any] = field(default_factory=dict)
    _child: dict[tuple[int, int], int] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def root_only(cls, token: int) -> "DraftTree":
        return cls([int(token)], [-1], ["root"], [0], [0], [{}])

    def __len__(self) -> int:
        return len(self.tokens)

    def child(self, parent: int, token: int) -> int:
        """Index of `parent`'s child carrying `token`, or -1."""
        return self._child.get((parent, token), -1)

    def add(self, parent: int, token: int, source: str, rank: int = 0, **meta: Any) -> int:
        """Add `token` under `parent`; an existing sibling with the same token is reused, so
        paths proposed by different sources merge (its source becomes "both")."""
        token = int(token)
        idx = self._child.get((parent, token))
        if idx is not None:
            if self.sources[idx] != source and {self.sources[idx], source} == {"retrieval", "logits"}:
                self.sources[idx] = "both"
            for k, v in meta.items():
                self.meta[idx].setdefault(k, v)
            return idx
        idx = len(self.tokens)
        self.tokens.append(token)
        self.parents.append(parent)
        self.sources.append(source)
        self.ranks.append(int(rank))
        self.depths.append(self.depths[parent] + 1)
        self.meta.append(meta)  # a fresh dict: `**meta` made it for this call
        self._child[(parent, token)] = idx
        return idx

    def add_path(self, tokens: Iterable[int], source: str, parent: int = 0) -> list[int]:
        """Add a chain of tokens below `parent`; returns the node indices."""
        out = []
        for r, t in enumerate(tokens):
            parent = self.add(parent, t, source, 0)
            out.append(parent)
        return out

    def path_to(self, node: int) -> list[int]:
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    def is_chain(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents))

    def ancestor_matrix(self) -> np.ndarray:
        """Boolean T x T: row i is True at i and at every ancestor of i."""
        # Rows as Python lists and one array at the end: this runs before every verify forward,
        # and a numpy call per node cost more than the lists for any tree a step drafts.
        n = len(self.tokens)
        rows: list[list[bool]] = []
        for i, p in enumerate(self.parents):
            row = rows[p].copy() if p >= 0 else [False] * n
            row[i] = True
            rows.append(row)
        return np.array(rows, dtype=bool).reshape(n, n)

    def visibility(self, past_len: int) -> torch.Tensor:
        """(T, past + T) bool on the CPU: True where a node sees a key (the whole prefix, its own
        ancestors and itself); `attention_mask` without a window, as the step kernel reads it."""
        n = len(self.tokens)
        vis = np.ones((n, past_len + n), dtype=bool)
        vis[:, past_len:] = self.ancestor_matrix()
        return torch.from_numpy(vis)

    def attention_mask(self, past_len: int, dtype: torch.dtype, device: torch.device | str,
                       window: int | None = None) -> torch.Tensor:
        """Additive float mask (1, 1, T, past + T): every node sees the whole prefix and its
        own ancestors; with a sliding `window`, only keys less than `window` positions behind
        it (a node's position is past_len + depth). Additive float, not bool: eager attention
        mis-reads bool masks."""
        n = len(self.tokens)
        blocked = torch.finfo(dtype).min
        # Built where it is used: only the T x T tree block (and the depths) cross to a device.
        device = torch.device(device)
        mask = torch.zeros((1, 1, n, past_len + n), dtype=dtype, device=device)
        mask[0, 0, :, past_len:].masked_fill_(_to(torch.from_numpy(~self.ancestor_matrix()), device), blocked)
        if window is not None:
            q = _to(torch.tensor(self.depths, dtype=torch.long), device) + past_len
            k = torch.cat([torch.arange(past_len, device=device), q])
            mask[0, 0].masked_fill_(q[:, None] - k[None, :] >= window, blocked)
        return mask

    @staticmethod
    def additive_mask(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """`attention_mask` (no window) from `visibility`'s result, on the CPU: 0 where a node
        sees a key, the dtype's lowest value elsewhere."""
        return torch.zeros(visible.shape, dtype=dtype).masked_fill_(~visible, torch.finfo(dtype).min)[None, None]

    def position_ids(self, past_len: int, device: torch.device | str) -> torch.Tensor:
        return _to(torch.tensor([[d + past_len for d in self.depths]], dtype=torch.long), device)

    def validate(self) -> None:
        """Raise if the structure is inconsistent (used by tests and the fuzzers)."""
        n = len(self.tokens)
        assert n >= 1 and self.parents[0] == -1 and self.sources[0] == "root"
        assert len(self.parents) == len(self.sources) == len(self.ranks) == len(self.depths) == n
        seen = set()
        for i in range(1, n):
            p = self.parents[i]
            assert 0 <= p < i, f"node {i} has parent {p}: not topological"
            assert self.depths[i] == self.depths[p] + 1
            assert self.sources[i] in SOURCES
            key = (p, self.tokens[i])
            assert key not in seen, f"duplicate sibling token {self.tokens[i]} under {p}"
            seen.add(key)

    def to_dict(self) -> dict[str, Any]:
        return {
            "tokens": list(self.tokens),
            "parents": list(self.parents),
            "sources": list(self.sources),
            "ranks": list(self.ranks),
            "depths": list(self.depths),
            "meta": [dict(m) for m in self.meta],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "DraftTree":
        return cls.from_lists(list(d["tokens"]), list(d["parents"]), list(d["sources"]), list(d["ranks"]),
                              list(d["depths"]), [dict(m) for m in d.get("meta") or [{} for _ in d["tokens"]]])

    @classmethod
    def from_lists(cls, tokens: list[int], parents: list[int], sources: list[str], ranks: list[int],
                   depths: list[int], meta: list[dict[str, Any]], info: dict[str, Any] | None = None) -> "DraftTree":
        """A tree on these lists as they are (not copied), with its child index built."""
        t = cls(tokens, parents, sources, ranks, depths, meta, info if info is not None else {})
        t._child = {(p, tok): i for i, (p, tok) in enumerate(zip(parents, tokens)) if p >= 0}
        return t
