"""Token text for pictures: whitespace made visible, display widths, HTML-safe labels."""
from __future__ import annotations

import html
import unicodedata
from typing import Callable, Iterable

#: Whitespace and control characters drawn as visible glyphs in labels.
VISIBLE = {" ": "·", "\n": "⏎", "\t": "⇥", "\r": "␍", "\u00a0": "⍽", "\f": "↡", "\v": "↧"}
ELLIPSIS = "…"


def visible(text: str) -> str:
    """`text` with spaces, newlines and tabs drawn as ·, ⏎ and ⇥; other controls as \\xNN."""
    out = []
    for ch in text:
        if ch in VISIBLE:
            out.append(VISIBLE[ch])
        elif unicodedata.category(ch) in ("Cc", "Cf"):
            out.append(f"\\x{ord(ch):02x}" if ord(ch) < 256 else f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return "".join(out) if out else "∅"


def char_cells(ch: str) -> int:
    """Monospace cells a character takes: 2 for wide (CJK), 0 for combining marks."""
    if unicodedata.combining(ch):
        return 0
    return 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1


def cells(text: str) -> int:
    return sum(char_cells(c) for c in text)


def truncate(text: str, max_cells: int) -> str:
    """Cut `text` to at most `max_cells` display cells, marking a cut with '…'."""
    if cells(text) <= max_cells:
        return text
    out, used = [], 0
    for ch in text:
        w = char_cells(ch)
        if used + w > max_cells - 1:
            break
        out.append(ch)
        used += w
    return "".join(out) + ELLIPSIS


def esc(text: str) -> str:
    """Escape for plotly text/hover (which read a subset of HTML)."""
    return html.escape(text, quote=False)


def esc_hover(text: str) -> str:
    """Escape for a plotly hovertemplate: HTML plus '%' (which starts a template field)."""
    return esc(text).replace("%", "&#37;")


def safe_decode(decode: Callable[[int], str], token: int) -> str:
    if token is None or int(token) < 0:
        return "ε"
    try:
        return str(decode(int(token)))
    except Exception:  # a picture must never crash on an odd token
        return f"<{int(token)}>"


def token_label(decode: Callable[[int], str], token: int) -> str:
    """Visible text of one token (unescaped; escape at the point of use)."""
    return visible(safe_decode(decode, token))


def string_label(decode: Callable[[int], str], tokens: Iterable[int], max_cells: int = 40) -> str:
    """Visible text of a token string (e.g. an automaton node's path)."""
    return truncate(visible("".join(safe_decode(decode, t) for t in tokens)), max_cells)
