"""Plain records the decode loop emits. The UI, the benchmark and the tests read only these."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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

    @property
    def accept_length(self) -> int:
        return len(self.committed)

    @property
    def accepted_sources(self) -> list[str]:
        return [self.tree.sources[i] for i in self.accepted[: len(self.committed)]]

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index, "root": self.root, "tree": self.tree.to_dict(),
            "accepted": list(self.accepted), "committed": list(self.committed),
            "next_root": self.next_root, "context_len": self.context_len,
            "timings": dict(self.timings), "forwarded": self.forwarded, "info": self.info,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "StepRecord":
        return cls(d["index"], d["root"], DraftTree.from_dict(d["tree"]), list(d["accepted"]),
                   list(d["committed"]), d["next_root"], d["context_len"], dict(d["timings"]),
                   d.get("forwarded", True), dict(d.get("info") or {}))


def mean_accepted(tokens: int, forwards: int) -> float:
    """MAT, mean accepted tokens: generated tokens per verification forward, the prefill's forward
    counted (it fixes the first token; every later forward fixes its accepted drafts and the next
    token). Plain decoding is exactly 1.0 however a run ends. The one definition the loop, the
    race, the benchmark and the app use."""
    return tokens / forwards if forwards > 0 else 0.0


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
