"""The one colour code of RACER: plain hex strings and plain names, used by the command line,
the figures (`visuals.colors`) and the app's coloured text and legends (`racer_app.format`).

This is the lowest layer: it imports nothing, so the CLI can colour a terminal without plotly
and every picture can take its colours from here (there is no second definition anywhere).

Draft sources (the keys of `racer.tree.SOURCES`) use the Okabe–Ito palette, which stays
distinguishable under the common colour-vision deficiencies (tests/test_palette.py checks the
pairwise colour difference under simulated protanopia, deuteranopia and tritanopia):

* root      grey #6B6B6B: the model's own token; neutral, because it was never a guess.
* retrieval blue #0072B2: "seen before in the context" (the Aho–Corasick automaton).
* logits    orange #E69F00: the copy-logit table, the model's own earlier predictions; it is the
  opposite of blue on the colour wheel, so the two signals never read as one.
* both      bluish green #009E73: retrieval and logits agreed; green sits between the two.
* lookup    reddish purple #CC79A7: prompt lookup (text copied from an earlier occurrence).
  It used to be sky blue, which read as a shade of retrieval.
* template  yellow #F0E442: Token Recycling's fixed template tree; the palest hue, used only by
  that baseline.

Decode methods reuse a source colour only where the meaning is the same: plain decoding (`ar`)
is the root grey (all its tokens are the model's own), prompt lookup (`pld`, `hf-pld`) the lookup
colour, the RACER ablations their one signal's colour. RACER itself is vermillion #D55E00 and
Token Recycling black, neither of which is a source colour; any other method gets one of
EXTRA_COLORS, which are neither.

The automaton's LRU age is a grey scale (one achromatic hue), dark when a node was just used and
pale when it is old: old leaves fade out because they are the next to be recycled, and a scale
without hue cannot be mistaken for a draft source. Failure links are dashed vermillion, borders
framed in retrieval blue (they feed the retrieval tree), the match state framed in black.
"""
from __future__ import annotations

#: Colour by draft source (keys = racer.tree.SOURCES).
SOURCE_COLORS: dict[str, str] = {
    "root": "#6B6B6B",
    "retrieval": "#0072B2",
    "logits": "#E69F00",
    "both": "#009E73",
    "lookup": "#CC79A7",
    "template": "#F0E442",
}
#: Plain words for colour names (the terminal legend says which colour is which).
SOURCE_HUES: dict[str, str] = {
    "root": "grey", "retrieval": "blue", "logits": "orange", "both": "green",
    "lookup": "purple", "template": "yellow",
}
#: Short names for figure legends (legend columns are as wide as the longest name: keep them short).
SOURCE_NAMES: dict[str, str] = {
    "root": "root (model's token)",
    "retrieval": "retrieval (seen before)",
    "logits": "logits (copy-logit)",
    "both": "both signals",
    "lookup": "prompt lookup (copied)",
    "template": "template tree",
}
#: Names in plain words where there is room (HTML legends).
SOURCE_LONG_NAMES: dict[str, str] = {
    **SOURCE_NAMES,
    "root": "root (the model's own token)",
    "lookup": "prompt lookup (copied from an earlier occurrence)",
    "template": "template tree (Token Recycling's fixed tree)",
}

#: The accepted path is black and thick, so reading it never depends on hue.
ACCEPTED_COLOR = "#000000"
REJECTED_COLOR = "#BDBDBD"

#: Decode methods, by the names of racer.drafters.METHODS (plus transformers' hf-pld).
METHOD_COLORS: dict[str, str] = {
    "racer": "#D55E00",
    "ar": SOURCE_COLORS["root"],
    "pld": SOURCE_COLORS["lookup"],
    "hf-pld": SOURCE_COLORS["lookup"],
    "racer-retrieval": SOURCE_COLORS["retrieval"],
    "racer-logits": SOURCE_COLORS["logits"],
    "tr": "#000000",
}
#: Other spellings of the same methods (figures and records use some of these).
METHOD_ALIASES: dict[str, str] = {
    "greedy": "ar", "autoregressive": "ar", "plain": "ar", "baseline": "ar",
    "token-recycling": "tr", "recycling": "tr",
    "lookup": "pld", "prompt-lookup": "pld",
    "racer-no-logits": "racer-retrieval", "racer-no-retrieval": "racer-logits",
}
#: For any other method: Paul Tol's wine, indigo, olive and brown, hues that are neither a source
#: nor a named method colour (teal and light blue were left out: they read as "both" and retrieval).
EXTRA_COLORS: tuple[str, ...] = ("#882255", "#332288", "#999933", "#661100")

#: Automaton figure.
TRIE_EDGE_COLOR = "#8C8C8C"
FAIL_LINK_COLOR = "#D55E00"
STATE_COLOR = "#000000"
BORDER_COLOR = SOURCE_COLORS["retrieval"]
#: LRU age, fresh (just used) to old: grey stops of rising lightness. The stops skip the root
#: grey itself; the pale end stays visible on a white page.
AGE_COLORS: tuple[str, ...] = ("#1F1F1F", "#474747", "#7A7A7A", "#A8A8A8", "#D0D0D0", "#EBEBEB")

#: Latency phases. The draft is RACER's own work (its vermillion) and the forward the model's
#: (dark grey); the rest avoid the source colours so a phase never reads as a source.
PHASE_COLORS: dict[str, str] = {
    "draft": "#D55E00",
    "forward": "#404040",
    "verify": "#882255",
    "cache": "#A6A6A6",
    "update": "#999933",
    "sizing": "#332288",
}


def method_key(method: str) -> str:
    """The palette's name for a method: lower case, '-' for '_' and spaces, aliases resolved."""
    m = str(method).strip().lower().replace("_", "-").replace(" ", "-")
    return METHOD_ALIASES.get(m, m)


def method_color(method: str, index: int = 0) -> str:
    """Colour of a decode method; unknown methods get EXTRA_COLORS[index] (wrapping)."""
    return METHOD_COLORS.get(method_key(method), EXTRA_COLORS[index % len(EXTRA_COLORS)])


def hex_rgb(color: str) -> tuple[int, int, int]:
    """(r, g, b) 0..255 of '#rrggbb'."""
    return int(color[1:3], 16), int(color[3:5], 16), int(color[5:7], 16)


def rgb_hex(r: float, g: float, b: float) -> str:
    return "#{:02X}{:02X}{:02X}".format(*(min(255, max(0, round(c))) for c in (r, g, b)))


def relative_luminance(r: float, g: float, b: float) -> float:
    """WCAG relative luminance of an sRGB colour with 0..255 channels."""
    lin = [(c / 255) / 12.92 if c / 255 <= 0.04045 else ((c / 255 + 0.055) / 1.055) ** 2.4 for c in (r, g, b)]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def text_color_on(color: str) -> str:
    """Black or white, whichever has the higher contrast on `color` ('#rrggbb' or 'rgb(r, g, b)')."""
    if color.startswith("#"):
        r, g, b = hex_rgb(color)
    else:
        r, g, b = (float(v) for v in color[color.index("(") + 1:color.index(")")].split(",")[:3])
    # Contrast with black (L + .05) / .05 equals contrast with white 1.05 / (L + .05) at L = 0.179.
    return "#000000" if relative_luminance(r, g, b) > 0.179 else "#FFFFFF"


def age_color(fraction: float) -> str:
    """The LRU-age grey at `fraction` of the scale (0 = just used, 1 = oldest), interpolated."""
    t = min(max(float(fraction), 0.0), 1.0) * (len(AGE_COLORS) - 1)
    i = min(int(t), len(AGE_COLORS) - 2)
    a, b = hex_rgb(AGE_COLORS[i]), hex_rgb(AGE_COLORS[i + 1])
    return rgb_hex(*(x + (y - x) * (t - i) for x, y in zip(a, b)))


def age_colorscale() -> list[list]:
    """AGE_COLORS as a plotly colour scale ([[position, colour], ...])."""
    n = len(AGE_COLORS) - 1
    return [[i / n, c] for i, c in enumerate(AGE_COLORS)]


def ansi_background(color: str) -> str:
    """24-bit ANSI escape: background `color` with whichever of black/white text reads on it."""
    r, g, b = hex_rgb(color)
    fg = hex_rgb(text_color_on(color))
    return f"\033[48;2;{r};{g};{b}m\033[38;2;{fg[0]};{fg[1]};{fg[2]}m"
