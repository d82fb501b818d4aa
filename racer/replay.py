"""Rebuild a drafter's state at any recorded step, without the model.

A drafter sees only token ids and the model's top-k rows (racer.drafters.base), and the tree
sizer only the trees, the accepted paths and the step timings. A run's `StartRecord` and its
step records keep all of that, so feeding them to a fresh drafter and sizer in the decode
loop's order rebuilds, exactly, the state the run had before any step: its automaton, its
copy-logit table, its lookup index and what the sizer had learned. That is what the step
inspector's anatomy and "what if" views are drawn from.

Why replay rather than keeping a copy of the state at every step: the copy-logit table alone
is vocabulary x K (3 MB for SmolLM2, 17 MB for Gemma 3), per step; the records hold the same
information in about 1 KB a step, and replaying a step costs about a millisecond (measured:
docs/PERFORMANCE.md, "Replaying a trace").

Every replayed step is checked against the record: the drafted-and-sized tree must be the
recorded tree, node for node. A mismatch (a trace from another version of the drafter, or a
sizer whose settings were not recorded) is reported where it happens, never papered over.

    replay = Replay(turns, lambda: make_drafter("racer", vocab_size=V), lambda: Sizer(curve))
    at = replay.before(k)            # state just before step k of the last turn is drafted
    pool = at.propose()              # the candidates the drafter proposed then
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from .drafters.base import Drafter, Verified
from .records import StartRecord, StepRecord
from .sizing import Sizer
from .tree import DraftTree


@dataclass
class Turn:
    """One decode of a trace: how its drafter was started and its step records (a chat has a
    turn per message; a race or a single run has one)."""
    start: StartRecord
    steps: list[StepRecord] = field(default_factory=list)


class ReplayError(RuntimeError):
    """The replayed drafter did not reproduce a recorded step."""


def same_tree(a: DraftTree, b: DraftTree) -> bool:
    return a.tokens == b.tokens and a.parents == b.parents and a.sources == b.sources


@dataclass
class StepState:
    """The replayed state just before step `k` (of the last turn) is drafted."""
    k: int
    step: StepRecord
    drafter: Drafter
    sizer: Sizer | None
    #: Every token fed to the model before this step (prompt + committed so far).
    context: list[int]

    def propose(self) -> DraftTree:
        """The drafter's candidates for this step, as the run got them (before sizing).

        Calling it more than once at the same step is harmless: the only state drafting
        touches is the automaton's LRU clock of the borders, and that is the same value
        again (it ticks only when tokens are fed)."""
        return self.drafter.propose(self.context, self.step.root, self.step.capacity or 1)


class Replay:
    """Replays `turns` with drafters and sizers from the factories (the same settings as the
    run). Each call replays from the start: stateless, so it keeps nothing per visitor between
    calls (a trace's steps replay at about a millisecond each)."""

    def __init__(self, turns: list[Turn], make_drafter: Callable[[], Drafter],
                 make_sizer: Callable[[], Sizer] | None = None, cold_rows: Any = None) -> None:
        """`cold_rows`: the model's cold rows (racer.coldrows), handed to the drafter from the
        first turn whose start record says the run's drafter had them."""
        if not turns:
            raise ValueError("nothing to replay: no turns")
        self.turns = turns
        self.make_drafter = make_drafter
        self.make_sizer = make_sizer
        self.cold_rows = cold_rows

    @property
    def steps(self) -> list[StepRecord]:
        """The last turn's steps (the ones a trace shows)."""
        return self.turns[-1].steps

    def before(self, k: int, detail: bool = False) -> StepState:
        """The state just before step `k` of the last turn is drafted (every earlier step
        replayed and checked). `detail` asks the drafter for picture data at step k."""
        last = self.turns[-1].steps
        if not 0 <= k < len(last):
            raise IndexError(f"step {k} is not in this trace ({len(last)} steps)")
        drafter = self.make_drafter()
        sizer = self.make_sizer() if self.make_sizer is not None else None
        drafter.detail = False
        for t, turn in enumerate(self.turns):
            is_last = t == len(self.turns) - 1
            topk, topk_p = turn.start.full_topk()
            if turn.start.cold_rows:
                if self.cold_rows is None:
                    raise ReplayError(f"turn {t + 1}: the run drafted with the model's cold rows, which this replay "
                                      f"does not have")
                drafter.use_cold_rows(self.cold_rows)
            drafter.start(list(turn.start.context), turn.start.new_from, topk, topk_p)
            context = list(turn.start.context)
            for i, rec in enumerate(turn.steps):
                if is_last and i == k:
                    drafter.detail = detail
                    return StepState(k, rec, drafter, sizer, context)
                advance(drafter, sizer, rec, context, turn=t, step=i)
        raise AssertionError("unreachable")


def advance(drafter: Drafter, sizer: Sizer | None, rec: StepRecord, context: list[int], *,
            turn: int = 0, step: int = 0, pool: DraftTree | None = None) -> None:
    """Replay one recorded step on `drafter` and `sizer` in the decode loop's order (draft,
    size, then observe), appending its committed tokens to `context`. Raises ReplayError when
    the drafter (and sizer) do not reproduce the recorded tree. `pool`: the step's proposal
    when the caller has already drafted it (drafting twice is harmless, see StepState)."""
    if not rec.forwarded:
        context.append(rec.root)
        drafter.observe(Verified(DraftTree.root_only(rec.root), None, [0], [rec.root], -1, context, None))
        return
    if pool is None:
        pool = drafter.propose(context, rec.root, rec.capacity or 1)
    tree = sizer.size(pool, len(context)) if sizer is not None else pool
    if not same_tree(tree, rec.tree):
        raise ReplayError(f"turn {turn + 1}, step {step + 1}: the replayed drafter proposed another tree than the "
                          f"run ({len(tree)} nodes against {len(rec.tree)})")
    context.extend(rec.committed)
    # The replayed tree (equal to the record's, its per-node data included) is what the loop
    # handed to the drafter and the sizer.
    drafter.observe(Verified(tree, rec.topk, list(rec.accepted), list(rec.committed),
                             -1 if rec.next_root is None else rec.next_root, context, rec.topk_p))
    if sizer is not None:
        sizer.observe(tree, rec.verified_path or list(rec.accepted), rec.timings, topk_p=rec.topk_p)
