"""Prompt lookup decoding: draft the continuation after the most recent earlier occurrence of
the last 3 (then 2, then 1) tokens of prompt + output, as a chain of up to 10 tokens.
`periodic=True` (used inside racer, not by the `pld` method) continues a chain that runs into
the present by repeating it."""
from __future__ import annotations

import numpy as np

from ..tree import DraftTree
from .base import Drafter


#: Longest backward agreement `match_run` looks for.
MAX_RUN = 32


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

    def __init__(self, max_ngram: int = 3, max_draft: int = 10, periodic: bool = False) -> None:
        self.max_ngram, self.max_draft = max_ngram, max_draft
        # When the matched occurrence is so recent that its continuation runs into the present,
        # plain prompt lookup stops there. `periodic` keeps copying: the text since the match
        # is taken to repeat (a list pattern, a refrain, or a small model's loop), so the chain
        # continues with its own earlier tokens, up to `max_draft`.
        self.periodic = periodic
        self.reset()

    def reset(self) -> None:
        # n-gram -> end index of its latest occurrence; kept incrementally so a lookup is O(1).
        self._last: dict[tuple[int, ...], int] = {}
        self._indexed = 0

    def start(self, context: list[int], new_from: int, topk: np.ndarray | None,
              topk_p: np.ndarray | None = None) -> None:
        self.reset()

    def _index(self, context: list[int]) -> None:
        for end in range(self._indexed, len(context)):
            for n in range(1, self.max_ngram + 1):
                if end - n + 1 >= 0:
                    self._last[tuple(context[end - n + 1:end + 1])] = end
        self._indexed = len(context)

    def propose(self, context: list[int], root: int, capacity: int) -> DraftTree:
        tree = DraftTree.root_only(root)
        limit = min(self.max_draft, capacity - 1)
        if limit <= 0:
            return tree
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
                for i, t in enumerate(cont[:limit]):
                    tree.add(i, t, "lookup", 0)
                tree.info["match_len"] = n
                tree.info["match_run"] = match_run(context, end, root)
                return tree
        return tree
