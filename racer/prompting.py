"""Turning a prompt or a chat into input ids with the model's chat template.

User text is always tokenised as text: a prompt that contains "<|im_end|>" must not close the
turn. The template is rendered around unique placeholders; the template's own pieces are
tokenised with special tokens, the messages' contents with special tokens split.
"""
from __future__ import annotations

import secrets
from typing import Any, Sequence, Union

Messages = Sequence[dict[str, str]]
PromptLike = Union[str, Messages]


def to_messages(prompt: PromptLike, system: str | None = None) -> list[dict[str, str]]:
    """A prompt string or role/content messages, with an optional system prompt first."""
    if isinstance(prompt, str):
        msgs = [{"role": "user", "content": prompt}]
    else:
        msgs = [{"role": str(m["role"]), "content": str(m["content"])} for m in prompt]
        for m in msgs:
            if m["role"] not in ("system", "user", "assistant"):
                raise ValueError(f"unknown chat role '{m['role']}' (use system, user or assistant)")
    if system and system.strip() and not (msgs and msgs[0]["role"] == "system"):
        msgs = [{"role": "system", "content": system}] + msgs
    return msgs


def build_input_ids(tokenizer: Any, prompt: PromptLike, system: str | None = None,
                    add_generation_prompt: bool = True) -> list[int]:
    """Input ids for a prompt or a multi-turn chat, ending with the assistant's turn opener."""
    msgs = to_messages(prompt, system)
    if not getattr(tokenizer, "chat_template", None):
        # Base models have no template: plain text, turns separated by blank lines.
        text = "\n\n".join(m["content"] for m in msgs)
        ids = tokenizer(text, add_special_tokens=True, split_special_tokens=True)["input_ids"]
        return list(ids)
    marks = [f"\u2063RACER{secrets.token_hex(6)}{i}\u2063" for i in range(len(msgs))]
    templated = [{"role": m["role"], "content": mark} for m, mark in zip(msgs, marks)]
    rendered = tokenizer.apply_chat_template(templated, add_generation_prompt=add_generation_prompt, tokenize=False)
    ids: list[int] = []
    rest = rendered
    for m, mark in zip(msgs, marks):
        head, sep, rest = rest.partition(mark)
        if not sep:  # a template that drops a message (rare): fall back to whole-string rendering
            return _plain(tokenizer, msgs, add_generation_prompt)
        ids += _encode(tokenizer, head, special=True)
        ids += _encode(tokenizer, m["content"], special=False)
    ids += _encode(tokenizer, rest, special=True)
    return ids


def _encode(tokenizer: Any, text: str, special: bool) -> list[int]:
    if not text:
        return []
    return list(tokenizer(text, add_special_tokens=False, split_special_tokens=not special)["input_ids"])


def _plain(tokenizer: Any, msgs: list[dict[str, str]], add_generation_prompt: bool) -> list[int]:
    out = tokenizer.apply_chat_template(msgs, add_generation_prompt=add_generation_prompt, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the shared prefix: how much of a new chat turn's ids a session has already fed."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
