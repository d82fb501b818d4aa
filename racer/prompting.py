"""Turning a prompt or a chat into input ids with the model's chat template.

Two promises, both tested against the real tokenizers (tests/test_prompting.py):

* Faithful: for messages whose text holds no control-token string, the ids are exactly
  `tokenizer.apply_chat_template(messages, add_generation_prompt=True)`, the ids the model was
  trained on, whatever the template does to the text (Gemma's `| trim`, Qwen3's thinking blocks)
  and however BPE merges the text with the template around it.
* Safe: user text never becomes control tokens. A control string in a message (`<|im_end|>`,
  `<start_of_turn>`, `</s>`, ...) is tokenised as the text it is, and that is the only difference
  from the reference ids.

Control strings are the tokenizer's special tokens (added tokens flagged special, and
`all_special_tokens`), except whitespace-only ones, which templates write as ordinary text.
Non-special added tokens (Qwen3's `<think>`, Gemma's `<table>`) are left as the tokenizer parses
them: templates read them in message text (Qwen3 splits assistant history at `</think>`). The
unknown token is a control string too, but plain text may still yield it where the vocabulary
lacks a character, as the reference does.

How (chat templates):
1. Each control string in a message is wrapped in a pair of markers made fresh for the call
   (private-use characters around a random nonce). Wrapping, not replacing, keeps the string
   visible to the template (one that tests or splits on it still sees it), and the markers are no
   whitespace, so `trim` acts as it would on the real text.
2. The template is rendered with the wrapped messages and the markers are taken out again: that
   is the reference's rendered text, plus the spans of the user's control strings. A marker that
   the template parted from its partner is dropped.
3. The text is tokenised once, as `apply_chat_template` tokenises it (special tokens parsed, no
   BOS added), with character offsets, and each control token overlapping a user span is replaced
   by the tokens of its text. A tokenizer cuts its input at added tokens before anything else, so
   every other token is the reference's own: nothing is tokenised apart from its neighbours, so no
   BPE merge and no SentencePiece prefix space changes at a cut. (The former design tokenised
   each message apart from the template: even the default model's own template then gave other
   ids for text starting with spaces or a newline, and `trim` was lost.)
4. Defence in depth: text could also form a control token with its neighbours ("<|im_" ending one
   message and "end|>" opening the next under a template that joins them). The template's own
   control tokens are counted from a rendering with opaque placeholders for the messages; if the
   ids hold more of any, the placeholder rendering is used instead: template pieces parsed, message
   texts as text. Safe but not faithful, and only such text reaches it.

Text is tokenised as text (what `split_special_tokens=True` gives) without touching the shared
tokenizer: the non-special added tokens are matched here, and the backend's normalizer,
pre-tokenizer and model run directly on the rest, so no special token can match. (Passing
`split_special_tokens=True` sets a flag on the shared Rust tokenizer for each call; another
thread can flip it between the set and the encode.) A Metaspace pre-tokenizer that puts "▁" before
the first piece of a string only gets a copy with that prefix off, because a user's control
string always sits inside the text: it reads as it would there, with no space added before it.

Tokenizers without offsets (Python-backed ones) take the same steps but tokenise the text in
pieces cut at the user's control strings, which is what their own tokenisation does at added
tokens. Models without a chat template (base models) run as plain completion: the turns joined by
blank lines and tokenised as `tokenizer(text)` does (its BOS, its post-processor), every control
token in it as text.

Why not transformers' own `apply_chat_template(..., sanitize_control_tokens=True)` (5.24 has it;
the same idea of marking user control tokens)? It tokenises the text after each marked token apart
from the rest, behind a "\n" it strips again, and that guess changes the text next to the control
string on every "▁"- or "Ġ"-prefixing tokenizer of the tests (Metaspace "first" gains a "▁"
before the newline after it; "always", legacy and ByteLevel with a prefix space lose the one before
the next word). It also treats non-special added tokens that the template writes as control
tokens, its text path flips the shared flag above, and it has no answer to a control token formed
across a boundary.
"""
from __future__ import annotations

import copy
import json
import re
import secrets
import weakref
from collections import Counter
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Union

Messages = Sequence[dict[str, str]]
PromptLike = Union[str, Messages]
Span = tuple[int, int]


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
    """Input ids for a prompt or a multi-turn chat, ending with the assistant's turn opener.

    With a chat template: `apply_chat_template`'s ids, except that control strings in the messages
    stay text. Without one: plain completion of the turns joined by blank lines."""
    msgs = to_messages(prompt, system)
    if not getattr(tokenizer, "chat_template", None):
        return _completion_ids(tokenizer, msgs)
    ids = _chat_ids(tokenizer, msgs, add_generation_prompt)
    template_own = _template_controls(tokenizer, msgs, add_generation_prompt)
    if any(n > template_own[i] for i, n in _controls_in(tokenizer, ids).items()):
        return _placeholder_ids(tokenizer, msgs, add_generation_prompt)
    return ids


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the shared prefix: how much of a new chat turn's ids a session has already fed."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def control_strings(tokenizer: Any) -> frozenset[str]:
    """The strings that are control tokens to this tokenizer and stay text in user messages."""
    return _vocab(tokenizer).strings


def text_ids(tokenizer: Any, text: str) -> list[int]:
    """`text` tokenised as ordinary text, as it would read inside a prompt: what the tokenizer
    gives with `split_special_tokens=True` (other added tokens, like Gemma's `<table>`, still
    match), and never a control token id."""
    if not text:
        return []
    vocab = _vocab(tokenizer)
    ids = _plain_ids(tokenizer, vocab, text)
    if vocab.ids.isdisjoint(ids):
        return ids
    # The vocabulary merges the text into a control token: one piece per character cannot merge.
    ids = [i for ch in text for i in _plain_ids(tokenizer, vocab, ch)]
    if not vocab.ids.isdisjoint(ids):
        raise ValueError(f"this tokenizer makes a control token of the plain text {text!r}")
    return ids


# -- per-tokenizer facts, computed once ----------------------------------------------------------


@dataclass(frozen=True)
class _Vocab:
    strings: frozenset[str]
    defuse: frozenset[int]             # the ids of the control strings: made text where user text has them
    ids: frozenset[int]                # the same without the unknown token, which plain text yields for
                                       # characters the vocabulary lacks: these are never made from text
    pattern: Optional[re.Pattern]      # finds any control string, the longest at a position first
    ordinary: Optional[re.Pattern]     # finds any added token that is not special, the same way
    ordinary_tokens: dict[str, Any]    # their AddedTokens by text
    pre_tokenizer: Any                 # the backend's pre-tokenizer as it acts inside a text
    size: int                          # len(tokenizer) when read: one that gained tokens is read again


_VOCABS: "weakref.WeakKeyDictionary[Any, _Vocab]" = weakref.WeakKeyDictionary()


def _vocab(tokenizer: Any) -> _Vocab:
    size = len(tokenizer) if hasattr(tokenizer, "__len__") else -1
    try:
        cached = _VOCABS.get(tokenizer)
    except TypeError:                  # not weakly referable: read it each time
        cached = None
    if cached is not None and cached.size == size:
        return cached
    vocab = _read_vocab(tokenizer, size)
    try:
        _VOCABS[tokenizer] = vocab
    except TypeError:
        pass
    return vocab


def _read_vocab(tokenizer: Any, size: int) -> _Vocab:
    found = {t.content for t in getattr(tokenizer, "added_tokens_decoder", {}).values() if t.special}
    found |= set(getattr(tokenizer, "all_special_tokens", None) or ())
    strings = frozenset(s for s in found if s and not s.isspace())
    defuse = {tokenizer.convert_tokens_to_ids(s) for s in strings} if strings else set()
    defuse.discard(None)
    ids = defuse - {getattr(tokenizer, "unk_token_id", None)}
    ordinary = {t.content: t for t in getattr(tokenizer, "added_tokens_decoder", {}).values()
                if not t.special and t.content}
    backend = _backend(tokenizer)
    pre = _inside_text(backend.pre_tokenizer) if backend is not None else None
    return _Vocab(strings, frozenset(defuse), frozenset(ids), _any_of(strings), _any_of(ordinary), ordinary, pre, size)


def _any_of(strings: Any) -> Optional[re.Pattern]:
    """A pattern for any of the strings; at each position the longest, as a tokenizer matches
    its added tokens (leftmost, then longest)."""
    if not strings:
        return None
    return re.compile("|".join(map(re.escape, sorted(strings, key=len, reverse=True))))


def _backend(tokenizer: Any) -> Any:
    """The Rust tokenizer behind a fast tokenizer (offsets, and its pipeline for text), or None."""
    if not getattr(tokenizer, "is_fast", False):
        return None
    return getattr(tokenizer, "backend_tokenizer", None)


def _inside_text(pre_tokenizer: Any) -> Any:
    """A pre-tokenizer that treats its input as text inside a prompt: a Metaspace that prefixes
    "▁" only at the very start of a string ("first") is copied with the prefix off. One that
    prefixes every piece ("always") does the same inside a prompt and is kept."""
    if pre_tokenizer is None:
        return None
    try:
        state = json.loads(pre_tokenizer.__getstate__())
    except Exception:                  # a custom (Python) pre-tokenizer: nothing to read, used as it is
        return pre_tokenizer
    if not _first_prefix_off(state):
        return pre_tokenizer
    inside = copy.deepcopy(pre_tokenizer)
    inside.__setstate__(json.dumps(state).encode())
    return inside


def _first_prefix_off(state: Any) -> bool:
    """Set every Metaspace "first" prefix in a serialised pre-tokenizer to "never"; any changed?"""
    changed = False
    if isinstance(state, dict):
        if state.get("type") == "Metaspace" and state.get("prepend_scheme") == "first":
            state["prepend_scheme"] = "never"
            changed = True
        for value in state.values():
            changed |= _first_prefix_off(value)
    elif isinstance(state, list):
        for value in state:
            changed |= _first_prefix_off(value)
    return changed


def _plain_ids(tokenizer: Any, vocab: _Vocab, text: str) -> list[int]:
    """Text tokens, special tokens not matched (text_ids checks the result)."""
    backend = _backend(tokenizer)
    if backend is None:
        return list(tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])
    # The tokenizer's own steps with special tokens treated as text: its other added tokens cut
    # the text (taking the whitespace beside them where they strip it), the rest is modelled.
    # Their single_word and normalized flags are not modelled (the chat tokenizers we know leave
    # them off on non-special tokens; the tests compare with the tokenizer itself).
    ids: list[int] = []
    at = 0
    while vocab.ordinary is not None and (m := vocab.ordinary.search(text, at)) is not None:
        token = vocab.ordinary_tokens[m.group(0)]
        start, end = m.start(), m.end()
        while token.lstrip and start > at and text[start - 1].isspace():
            start -= 1
        while token.rstrip and end < len(text) and text[end].isspace():
            end += 1
        ids += _modelled_ids(backend, vocab, text[at:start])
        ids.append(tokenizer.convert_tokens_to_ids(token.content))
        at = end
    return ids + _modelled_ids(backend, vocab, text[at:])


def _modelled_ids(backend: Any, vocab: _Vocab, text: str) -> list[int]:
    """Text between added tokens through the backend's normalizer, pre-tokenizer and model."""
    if not text:
        return []
    normalized = backend.normalizer.normalize_str(text) if backend.normalizer is not None else text
    pre = vocab.pre_tokenizer
    words = [w for w, _ in pre.pre_tokenize_str(normalized)] if pre is not None else [normalized]
    return [t.id for w in words for t in backend.model.tokenize(w)]


def _controls_in(tokenizer: Any, ids: list[int]) -> Counter:
    controls = _vocab(tokenizer).ids
    return Counter(i for i in ids if i in controls)


# -- the faithful path ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Markers:
    """A pair of strings that no template writes and no user can guess (fresh for each call)."""
    open: str
    close: str

    @classmethod
    def fresh(cls) -> "_Markers":
        # Digits only: a template that changes the case of text leaves them as they are.
        nonce = "".join(secrets.choice("0123456789") for _ in range(16))
        return cls(f"\ue000{nonce}\ue001", f"\ue002{nonce}\ue003")

    def wrap(self, text: str, pattern: Optional[re.Pattern]) -> str:
        if pattern is None:
            return text
        return pattern.sub(lambda m: f"{self.open}{m.group(0)}{self.close}", text)

    def unwrap(self, rendered: str) -> tuple[str, list[Span]]:
        """The rendered text without markers, and the spans in it that stood between a pair."""
        o, c = re.escape(self.open), re.escape(self.close)
        marker = re.compile(f"{o}((?:(?!{o}|{c}).)*?){c}|{o}|{c}", re.DOTALL)
        out: list[str] = []
        spans: list[Span] = []
        at = length = 0
        for m in marker.finditer(rendered):
            out.append(rendered[at:m.start()])
            length += m.start() - at
            inner = m.group(1)
            if inner is not None:
                spans.append((length, length + len(inner)))
                out.append(inner)
                length += len(inner)
            at = m.end()
        out.append(rendered[at:])
        return "".join(out), spans


def _render(tokenizer: Any, msgs: list[dict[str, str]], add_generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(msgs, add_generation_prompt=add_generation_prompt, tokenize=False)


def _chat_ids(tokenizer: Any, msgs: list[dict[str, str]], add_generation_prompt: bool) -> list[int]:
    vocab = _vocab(tokenizer)
    markers = _Markers.fresh()
    wrapped = [{"role": m["role"], "content": markers.wrap(m["content"], vocab.pattern)} for m in msgs]
    text, spans = markers.unwrap(_render(tokenizer, wrapped, add_generation_prompt))
    return _defused_ids(tokenizer, text, spans, add_special_tokens=False)


def _completion_ids(tokenizer: Any, msgs: list[dict[str, str]]) -> list[int]:
    """Plain completion for base models: all the text is the user's, so every control token in it
    is text; the tokenizer's own BOS (or none) comes first, as for any plain text."""
    text = "\n\n".join(m["content"] for m in msgs)
    if _backend(tokenizer) is None:
        return list(tokenizer(text, add_special_tokens=True, split_special_tokens=True)["input_ids"])
    return _defused_ids(tokenizer, text, [(0, len(text))], add_special_tokens=True)


def _defused_ids(tokenizer: Any, text: str, spans: list[Span], add_special_tokens: bool) -> list[int]:
    """`text` tokenised with special tokens parsed, except that the control tokens overlapping a
    span become the tokens of their text."""
    if _backend(tokenizer) is None:
        return _defused_in_pieces(tokenizer, text, spans)
    # The call apply_chat_template makes (plus offsets), so every token outside the spans is its own.
    enc = tokenizer(text, add_special_tokens=add_special_tokens, return_offsets_mapping=True)
    controls = _vocab(tokenizer).defuse
    ids: list[int] = []
    for i, (start, end) in zip(enc["input_ids"], enc["offset_mapping"]):
        if i in controls and any(start < b and end > a for a, b in spans):
            # The token's own span: an added token that strips spaces beside it covers them too.
            ids += text_ids(tokenizer, text[start:end])
        else:
            ids.append(i)
    return ids


def _defused_in_pieces(tokenizer: Any, text: str, spans: list[Span]) -> list[int]:
    """Without offsets: the text between the spans with special tokens parsed, the spans as text."""
    ids: list[int] = []
    at = 0
    for a, b in spans:
        ids += _parsed_ids(tokenizer, text[at:a])
        ids += text_ids(tokenizer, text[a:b])
        at = b
    return ids + _parsed_ids(tokenizer, text[at:])


def _parsed_ids(tokenizer: Any, text: str) -> list[int]:
    """Template text: special tokens parsed, nothing added around it."""
    if not text:
        return []
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


# -- the template's own control tokens, and the safe rendering -----------------------------------


def _placeholders(tokenizer: Any, msgs: list[dict[str, str]], add_generation_prompt: bool) -> list[str]:
    """The template rendered with an opaque placeholder for each message's text, cut at them:
    [template, index, template, index, ..., template]. An empty text stays empty (templates test
    for it: `{% if system %}`), and has nothing to place."""
    nonce = "".join(secrets.choice("0123456789") for _ in range(16))
    held = [{"role": m["role"], "content": m["content"] and f"\ue000{nonce}:{k}\ue001"} for k, m in enumerate(msgs)]
    rendered = _render(tokenizer, held, add_generation_prompt)
    return re.split(f"\ue000{nonce}:(\\d+)\ue001", rendered)


def _template_controls(tokenizer: Any, msgs: list[dict[str, str]], add_generation_prompt: bool) -> Counter:
    """How many of each control token the template writes itself for these messages."""
    pieces = _placeholders(tokenizer, msgs, add_generation_prompt)
    return sum((_controls_in(tokenizer, _parsed_ids(tokenizer, p)) for p in pieces[::2]), Counter())


def _placeholder_ids(tokenizer: Any, msgs: list[dict[str, str]], add_generation_prompt: bool) -> list[int]:
    """The safe rendering: the template's pieces with special tokens parsed, every message's text
    as text (where the template put it; a message the template drops is dropped)."""
    pieces = _placeholders(tokenizer, msgs, add_generation_prompt)
    ids: list[int] = []
    for k, piece in enumerate(pieces):
        ids += _parsed_ids(tokenizer, piece) if k % 2 == 0 else text_ids(tokenizer, msgs[int(piece)]["content"])
    return ids
