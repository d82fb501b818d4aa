"""Prompt lookup decoding: draft the continuation after the most recent earlier occurrence of
the last 3 (then 2, then 1) tokens of prompt + output, as a chain of up to 10 tokens.
`periodic=True` (used inside racer, not by the `pld` method) continues a chain that runs into
the present by repeating it; racer's chain also picks its occurrence by how far back it agrees
(`pick="run"`) and runs longer behind a long agreement (`long_draft`)."""
from __future__ import annotations

import numpy as np

from ..tree import DraftTree
from .base import Drafter


#: Longest backward agreement `match_run` looks for.
MAX_RUN = 32
#: How many of the longest n-gram's latest occurrences `pick="run"` compares.
RUN_CANDIDATES = 4
#: Which earlier occurrence a chain copies: the latest ("recent", prompt lookup's rule) or, among
#: the latest RUN_CANDIDATES of the longest matching n-gram, the one whose text agrees furthest back.
PICKS = ("recent", "run")


def match_run(context: list[int], end: int, root: int) -> int:
    """How many tokens, ending at the matched occurrence's `end`, agree with the text ending at
    the root (the root included), up to `MAX_RUN`. Prompt lookup matches 3 tokens at most; a run
    of 20 says the model is copying a passage, and the continuation is far likelier to hold."""
    here = len(context)  # the root's position
    run = 0
    while run < MAX_RUN and end - run >= 0:
        a = context[end - run]
        b = root if run == 0 else context[here - run]
        if a != b:
            break
        run += 1
    return run


class PLDDrafter(Drafter):
    name = "pld"

    def __init__(self, max_ngram: int = 3, max_draft: int = 10, periodic: bool = False,
                 pick: str = "recent", long_draft: int = 0, long_run: int = 16) -> None:
        if pick not in PICKS:
            raise ValueError(f"unknown pick {pick!r}; known: {PICKS}")
        self.max_ngram, self.max_draft = max_ngram, max_draft
        # "run" (used inside racer): an occurrence that agrees with the text for 20 tokens is far
        # likelier to go on agreeing than the latest one that agrees for the n-gram alone; on
        # ar's Spec-Bench answers its chain held 5.7 % more of the next 8 tokens (docs/PERFORMANCE.md
        # §4.1, "The chain's source"). Shorter n-grams keep the latest occurrence: below the longest
        # n-gram every occurrence agrees for exactly n tokens.
        self.pick = pick
        # A match that agrees `long_run` tokens back is a passage being copied: its chain may
        # run to `long_draft` tokens (0: never beyond `max_draft`).
        self.long_draft, self.long_run = int(long_draft), int(long_run)
        # When the matched occurrence is so recent that its continuation runs into the present,
        # plain prompt lookup stops there. `periodic` keeps copying: the text since the match
        # is taken to repeat (a list pattern, a refrain, or a small model's loop), so the chain
        # continues with its own earlier tokens, up to `max_draft`.
        self.periodic = periodic
        self.reset()

    def reset(self) -> None:
        # n-gram -> end index of its latest occurrence; kept incrementally so a lookup is O(1).
        self._last: dict[tuple[int, ...], int] = {}
        # longest n-gram -> end indices of its latest RUN_CANDIDATES occurrences (pick="run")
        self._ends: dict[tuple[int, ...], list[int]] = {}
        self._indexed = 0

    def start(self, context: list[int], new_from: int, topk: np.ndarray | None,
              topk_p: np.ndarray | None = None) -> None:
        self.reset()

    def by_run(self, n: int) -> bool:
        """Whether a match of an `n`-gram picks its occurrence by how far back it agrees."""
        return self.pick == "run" and n == self.max_ngram

    def _index(self, context: list[int]) -> None:
        top = self.max_ngram if self.pick == "run" else 0
        for end in range(self._indexed, len(context)):
            for n in range(1, self.max_ngram + 1):
                if end - n + 1 >= 0:
                    key = tuple(context[end - n + 1:end + 1])
                    self._last[key] = end
                    if n == top:
                        ends = self._ends.setdefault(key, [])
                        ends.append(end)
                        if len(ends) > RUN_CANDIDATES:
                            del ends[0]
        self._indexed = len(context)

    def propose(self, context: list[int], root: int, capacity: int) -> DraftTree:
        tree = DraftTree.root_only(root)
        chain, n, run = self.chain(context, root, capacity - 1)
        for i, t in enumerate(chain):
            tree.add(i, t, "lookup", 0)
        if chain:
            tree.info["match_len"] = n
            tree.info["match_run"] = run
        return tree

    def chain(self, context: list[int], root: int, room: int) -> tuple[list[int], int, int]:
        """The chain below `root` (at most `room` tokens and `max_draft`, or `long_draft` when the
        match agrees at least `long_run` tokens back), the length of the n-gram it matched and
        how far back the match agrees (`match_run`); ([], 0, 0) when nothing matches."""
        limit = min(self.max_draft, room)
        if limit <= 0:
            return [], 0, 0
        if len(context) < self._indexed:  # a shorter context means a new conversation
            self.reset()
        self._index(context)
        for n in range(self.max_ngram, 0, -1):
            if n - 1 > len(context):
                continue
            key = tuple(context[len(context) - (n - 1):]) + (root,) if n > 1 else (root,)
            end = self._last.get(key)
            if end is None:
                continue
            run = -1
            if self.by_run(n):
                for e in reversed(self._ends[key]):  # latest first: a tie keeps the latest
                    r = match_run(context, e, root)
                    if r > run:
                        end, run = e, r
            else:
                run = match_run(context, end, root)
            if self.long_draft and run >= self.long_run:
                limit = min(max(self.long_draft, self.max_draft), room)
            # The continuation may run into the root itself (it follows the context).
            cont = context[end + 1:end + 1 + limit]
            if len(cont) < limit and end + 1 + len(cont) == len(context):
                cont = cont + [root]
                if self.periodic:
                    # Position len(context) + 1 + i repeats position end + 1 + i, which is
                    # either in the context or already drafted: period len(context) - end.
                    period = len(context) - end
                    while len(cont) < limit:
                        cont.append(cont[len(cont) - period])
            if cont:
                return cont[:limit], n, run
        return [], 0, 0
