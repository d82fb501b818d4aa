"""The drafter interface. Every method is a drafter; the decode loop is shared.

Life cycle, driven by `racer.loop.decode`:

1. `start(context, new_from, topk)` once after the prefill forward. `context` holds every
   token id fed to the model so far (for a chat turn: the whole conversation), `topk` is an
   int array (len(context) - new_from, K) with the K most likely next tokens at each newly
   fed position (None when `wants_topk == 0`), `topk_p` their probabilities (None unless
   `wants_topk_p`). Only the last occurrence of each token id
   among the new positions is filled; other rows are -1 (what a one-row-per-token table
   keeps is the same, and the vocabulary projection is skipped for them). A drafter given the
   model's cold rows gets only the final position's row (and those of tokens without a cold
   row): the loop skips the rest. State kept from earlier turns of the same
   session persists; `reset()` forgets everything.
2. Each step: `propose(context, root, capacity)` returns a `DraftTree` rooted at `root` (the
   token the model has just fixed, not yet in `context`) with at most `capacity` nodes
   including the root. Drafters put picture data in `tree.info` (plain JSON-able values).
3. After verification: `observe(step)` with a `Verified` step: exactly the tokens the run
   outputs, cut at an end-of-sequence token or max_new_tokens (the cut-off rest of an accepted
   path is never shown), and once more for a final token committed without a forward (a
   root-only tree, no top-k). It may return a dict of extra plain data for the step record
   (e.g. the automaton's evictions).

Drafters never touch the model; they see token ids and top-k ids only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..tree import DraftTree


@dataclass
class Verified:
    tree: DraftTree
    #: (T, K) int array: top-K next-token ids at every tree node, or None.
    topk: np.ndarray | None
    #: Accepted node indices, root (0) first.
    accepted: list[int]
    #: Token ids committed this step: root + accepted drafts (already appended to `context`).
    committed: list[int]
    #: The token fixed after the last accepted node (the next root); -1 after a final commit.
    next_root: int
    context: list[int]
    #: (T, K) float array: the model's probability of each `topk` entry, or None (given only
    #: to drafters with `wants_topk_p`).
    topk_p: np.ndarray | None = None


class Drafter:
    name: str = "base"
    #: How many top next-token ids per verified position the drafter needs (0 = none).
    wants_topk: int = 0
    #: Whether it also wants their probabilities (a log-sum-exp per verified position).
    wants_topk_p: bool = False
    #: When True, drafters add picture data (snapshots, rows used) to `tree.info`.
    detail: bool = False
    #: Whether it reads the model's cold rows (racer.coldrows); the loop then hands them over
    #: with `use_cold_rows` before `start`, where the model has them.
    wants_cold_rows: bool = False

    def reset(self) -> None:
        """Forget all state (a new session)."""

    def use_cold_rows(self, rows: Any) -> None:
        """The model's cold rows (racer.coldrows.ColdRows), for a drafter that `wants_cold_rows`."""

    def start(self, context: list[int], new_from: int, topk: np.ndarray | None,
              topk_p: np.ndarray | None = None) -> None:
        """Observe the prefill (`topk_p`: as in Verified)."""

    def propose(self, context: list[int], root: int, capacity: int) -> DraftTree:
        return DraftTree.root_only(root)

    def observe(self, step: Verified) -> dict[str, Any] | None:
        return None
