"""Figure 3 (as data): the generated text coloured by how each token was produced.

`text_spans(steps, decode)` returns `(spans, step_of)`: `spans` is a list of `(text, label)`
tuples that a `gr.HighlightedText` shows directly (label one of "root", "retrieval",
"logits", "both", "lookup" — prompt lookup, RACER's chain included — or "template" for Token
Recycling, and None for uncoloured text such as the prompt); `step_of[i]` is the step index
that produced `spans[i]` (-1 for the prompt). Adjacent tokens of one step with the same label
are merged into one span, never across steps, so step boundaries stay recoverable. Use
`colors.highlight_color_map(sources)` as the `color_map` (its colours are racer.palette's).

Per-token decoding splits multi-byte characters; pass `decode_many` (ids -> text, e.g.
`tokenizer.decode`) to decode each token in the context of its predecessors instead.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from ._data import get, tree_fields
from .tokens import safe_decode

Span = tuple[str, "str | None"]


def token_sources(step: Any) -> list[str]:
    """Label of every committed token of a step: "root" first, then each accepted node's source."""
    committed = list(get(step, "committed", []) or [])
    if not committed:
        return []
    tree = get(step, "tree")
    sources = tree_fields(tree)["sources"] if tree is not None else []
    accepted = list(get(step, "accepted", []) or [0])
    out = ["root"]
    for k in range(1, len(committed)):
        node = accepted[k] if k < len(accepted) else None
        out.append(sources[node] if node is not None and node < len(sources) else "logits")
    return out


class _Incremental:
    """Text of each new token given the tokens before it (the usual streaming detokenizer:
    handles characters split over tokens and tokenizers that merge leading spaces)."""

    def __init__(self, decode_many: Callable[[list[int]], str], context: int = 6):
        self.decode_many = decode_many
        self.context = context
        self.ids: list[int] = []
        self.prefix = 0   # start of the context window
        self.read = 0     # tokens already turned into text

    def feed_prompt(self, ids: Sequence[int]) -> None:
        self.ids.extend(int(t) for t in ids)
        self.read = len(self.ids)
        self.prefix = max(0, self.read - self.context)

    def push(self, token: int) -> str:
        self.ids.append(int(token))
        before = self.decode_many(self.ids[self.prefix:self.read])
        now = self.decode_many(self.ids[self.prefix:])
        if now.endswith("\ufffd"):
            return ""          # an incomplete character: wait for the next token
        out = now[len(before):] if now.startswith(before) else now[len(before):]
        self.read = len(self.ids)
        self.prefix = max(0, self.read - self.context)
        return out


def text_spans(steps: Sequence[Any], decode: Callable[[int], str] = str, *,
               prompt_ids: Sequence[int] | None = None, prompt_text: str | None = None,
               decode_many: Callable[[list[int]], str] | None = None,
               merge: bool = True) -> tuple[list[Span], list[int]]:
    """Coloured spans of the generated text plus the step index of every span (see module doc)."""
    spans: list[Span] = []
    step_of: list[int] = []
    inc = _Incremental(decode_many) if decode_many is not None else None
    if prompt_text:
        spans.append((prompt_text, None))
        step_of.append(-1)
    elif prompt_ids:
        if decode_many is not None:
            spans.append((decode_many(list(prompt_ids)), None))
            inc.feed_prompt(prompt_ids)
        else:
            spans.append(("".join(safe_decode(decode, t) for t in prompt_ids), None))
        step_of.append(-1)
    for k, step in enumerate(steps):
        idx = get(step, "index", k)
        committed = list(get(step, "committed", []) or [])
        for token, label in zip(committed, token_sources(step)):
            text = inc.push(token) if inc is not None else safe_decode(decode, token)
            if text == "" and inc is not None:
                continue
            if merge and spans and step_of[-1] == idx and spans[-1][1] == label:
                spans[-1] = (spans[-1][0] + text, label)
            else:
                spans.append((text, label))
                step_of.append(idx)
    return spans, step_of


def step_boundaries(step_of: Sequence[int]) -> list[int]:
    """Indices of the spans that start a new step."""
    return [i for i, s in enumerate(step_of) if i == 0 or s != step_of[i - 1]]
