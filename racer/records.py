"""Plain records the decode loop emits. The UI, the benchmark and the tests read only these."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .tree import DraftTree


@dataclass
class StepRecord:
    """One draft-and-verify step.

    `committed` = the root token plus the accepted draft tokens (in order); the token the
    forward fixed after the last accepted node becomes the next step's root (`next_root`).
    `accepted` lists the tree node indices of the accepted path, starting with 0 (the root).
    """
    index: int
    root: int
    tree: DraftTree
    accepted: list[int]
    committed: list[int]
    next_root: int | None
    context_len: int                    # tokens in the KV cache before this step
    timings: dict[str, float]           # draft_ms, forward_ms, verify_ms, cache_ms, update_ms, sizing_ms
    forwarded: bool = True              # False for the final step that only commits a pending root
    info: dict[str, Any] = field(default_factory=dict)
    #: What the drafter learned from this step, kept so the step can be replayed without the
    #: model (racer.replay): the model's top-K next tokens at every tree node (T, K) and their
    #: probabilities, for drafters that ask for them (copy-logit drafters), else None.
    topk: np.ndarray | None = None
    topk_p: np.ndarray | None = None
    #: The most nodes the drafter was asked for (the sizer's pool, or the fixed capacity).
    capacity: int = 0
    #: The accepted path before the run's commit limit cut it, only where it was cut (an
    #: end-of-sequence token or max_new_tokens inside the path): the sizer learned from all of it.
    verified_path: list[int] | None = None

    @property
    def accept_length(self) -> int:
        return len(self.committed)

    @property
    def accepted_sources(self) -> list[str]:
        return [self.tree.sources[i] for i in self.accepted[: len(self.committed)]]

    def to_dict(self) -> dict[str, Any]:
        d = {
            "index": self.index, "root": self.root, "tree": self.tree.to_dict(),
            "accepted": list(self.accepted), "committed": list(self.committed),
            "next_root": self.next_root, "context_len": self.context_len,
            "timings": dict(self.timings), "forwarded": self.forwarded, "info": self.info,
            "capacity": self.capacity,
        }
        if self.topk is not None:
            d["topk"] = np.asarray(self.topk).tolist()
        if self.topk_p is not None:
            # The float32 values as exact doubles, so a replay buckets them exactly as the run did.
            d["topk_p"] = np.asarray(self.topk_p, dtype=np.float32).tolist()
        if self.verified_path is not None:
            d["verified_path"] = list(self.verified_path)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "StepRecord":
        topk = np.asarray(d["topk"], dtype=np.int64) if d.get("topk") is not None else None
        topk_p = np.asarray(d["topk_p"], dtype=np.float32) if d.get("topk_p") is not None else None
        vp = d.get("verified_path")
        return cls(d["index"], d["root"], DraftTree.from_dict(d["tree"]), list(d["accepted"]),
                   list(d["committed"]), d["next_root"], d["context_len"], dict(d["timings"]),
                   d.get("forwarded", True), dict(d.get("info") or {}), topk, topk_p, int(d.get("capacity") or 0),
                   list(vp) if vp is not None else None)


@dataclass
class StartRecord:
    """What a run's drafter was started with after the prefill (`Drafter.start`): the whole
    context, where its new part begins, and the model's top-K next tokens at the new positions
    that the copy-logit table keeps (the last occurrence of each token id; `rows` are their
    offsets from `new_from`, the other positions are -1). With the run's step records it is
    everything needed to rebuild the drafter's state at any step (racer.replay)."""
    context: list[int]
    new_from: int
    rows: list[int] = field(default_factory=list)
    topk: np.ndarray | None = None
    topk_p: np.ndarray | None = None
    #: Whether the drafter had the model's cold rows (racer.coldrows) from this decode on.
    cold_rows: bool = False

    def full_topk(self) -> tuple[np.ndarray | None, np.ndarray | None]:
        """The (len(context) - new_from, K) arrays `Drafter.start` was given."""
        if self.topk is None:
            return None, None
        n, k = len(self.context) - self.new_from, int(np.asarray(self.topk).shape[1])
        topk = np.full((n, k), -1, dtype=np.int64)
        topk[self.rows] = self.topk
        p = None
        if self.topk_p is not None:
            p = np.full((n, k), -1.0, dtype=np.float32)
            p[self.rows] = self.topk_p
        return topk, p

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"context": list(self.context), "new_from": self.new_from, "rows": list(self.rows)}
        if self.topk is not None:
            d["topk"] = np.asarray(self.topk).tolist()
        if self.topk_p is not None:
            d["topk_p"] = np.asarray(self.topk_p, dtype=np.float32).tolist()
        if self.cold_rows:
            d["cold_rows"] = True
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "StartRecord":
        topk = np.asarray(d["topk"], dtype=np.int64).reshape(len(d["rows"]), -1) if d.get("topk") is not None else None
        p = np.asarray(d["topk_p"], dtype=np.float32).reshape(len(d["rows"]), -1) if d.get("topk_p") is not None \
            else None
        return cls([int(t) for t in d["context"]], int(d["new_from"]), [int(r) for r in d["rows"]], topk, p,
                   bool(d.get("cold_rows", False)))


def mean_accepted(tokens: int, forwards: int) -> float:
    """MAT, mean accepted tokens: generated tokens per verification forward, the prefill's forward
    counted (it fixes the first token; every later forward fixes its accepted drafts and the next
    token). Plain decoding is exactly 1.0 however a run ends. The one definition the loop, the
    race, the benchmark and the app use."""
    return tokens / forwards if forwards > 0 else 0.0


@dataclass(frozen=True)
class RunNumbers:
    """The counts every view shows for a run: step records, verification forwards and tokens."""
    tokens: int
    #: Step records: each commits at least one token (the last may commit without a forward).
    steps: int
    #: Verification forwards, the prefill's included (it fixes the first token).
    forwards: int

    @property
    def mat(self) -> float:
        return mean_accepted(self.tokens, self.forwards)


def run_numbers(steps: list[StepRecord]) -> RunNumbers:
    """The one count of a run's records that the sentence, the figures, the stats and the
    benchmark share (`DecodeResult` and the race's lanes count the same way)."""
    return RunNumbers(sum(len(s.committed) for s in steps), len(steps), 1 + sum(1 for s in steps if s.forwarded))


@dataclass
class DecodeResult:
    method: str
    prompt_len: int
    token_ids: list[int]
    text: str
    steps: int
    wall_s: float
    prefill_ms: float
    stop_reason: str                    # "eos", "max_new_tokens", "context_limit", "stopped", "time_limit"
    accept_lengths: list[int]
    timings: dict[str, float]           # totals over steps, ms
    #: Verification forwards, the prefill's included (it fixes the first token).
    forwards: int = 1

    @property
    def new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def mat(self) -> float:
        return mean_accepted(self.new_tokens, self.forwards)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method, "text": self.text, "token_ids": list(self.token_ids),
            "new_tokens": self.new_tokens, "steps": self.steps, "forwards": self.forwards, "mat": round(self.mat, 4),
            "tokens_per_s": round(self.tokens_per_s, 3), "wall_s": round(self.wall_s, 4),
            "prefill_ms": round(self.prefill_ms, 3), "prompt_len": self.prompt_len,
            "stop_reason": self.stop_reason, "accept_lengths": list(self.accept_lengths),
            "timings": {k: round(v, 3) for k, v in self.timings.items()},
        }
