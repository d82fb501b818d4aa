"""Plain autoregressive decoding: no draft, one token per forward, through the shared loop."""
from __future__ import annotations

from ..tree import DraftTree
from .base import Drafter


class ARDrafter(Drafter):
    name = "ar"

    def propose(self, context: list[int], root: int, capacity: int) -> DraftTree:
        return DraftTree.root_only(root)
