"""The one colour code of RACER Studio, and the legend that explains it.

Every figure and the coloured text use these colours, so a reader learns them once:

* **root**      — the token the model itself fixed (always accepted).
* **retrieval** — proposed by the Aho–Corasick automaton ("seen before in the context").
* **logits**    — proposed by the copy-logit table ("what the model predicted last time").
* **both**      — proposed by both signals (their paths merged in the tree).
* **accepted**  — the path the model agreed with (drawn thick and dark).
* **rejected**  — everything else in the tree (faded).

The hues are from the Okabe–Ito palette, which stays distinguishable under the common
colour-vision deficiencies; the accepted path is black and thick, so it never depends on hue.
"""
from __future__ import annotations

from typing import Iterable

import plotly.graph_objects as go

#: Node/token colour by source (keys = `racer.tree.SOURCES`).
SOURCE_COLORS: dict[str, str] = {
    "root": "#6B6B6B",       # neutral grey: the model's own token
    "retrieval": "#0072B2",  # blue
    "logits": "#E69F00",     # orange
    "both": "#009E73",       # bluish green
    "template": "#CC79A7",   # reddish purple (Token Recycling's static template tree)
    "lookup": "#56B4E9",     # sky blue (prompt lookup)
}
#: Human-readable names for the legend and for coloured text.
SOURCE_NAMES: dict[str, str] = {
    "root": "root (model's token)",
    "retrieval": "retrieval (seen before)",
    "logits": "logits (copy-logit)",
    "both": "both signals",
    "template": "template tree",
    "lookup": "prompt lookup",
}
#: The four sources RACER itself produces: always shown in legends so the code is stable.
CORE_SOURCES = ("root", "retrieval", "logits", "both")

ACCEPTED_COLOR = "#000000"   # accepted path: black, thick
REJECTED_COLOR = "#BDBDBD"   # rejected branches: faded grey
ACCEPTED_WIDTH = 4.0
REJECTED_WIDTH = 1.3

#: Automaton figure.
TRIE_EDGE_COLOR = "#8C8C8C"
FAIL_LINK_COLOR = "#D55E00"  # vermillion, dashed
STATE_COLOR = "#000000"
BORDER_COLOR = "#0072B2"     # borders feed the retrieval tree: retrieval blue
#: LRU age colour scale (fresh = light yellow, old = dark purple); fixed across steps.
AGE_COLORSCALE = "Viridis_r"

#: Decode methods (race, acceptance, latency, benchmark figures).
METHOD_COLORS: dict[str, str] = {
    "racer": "#D55E00",            # vermillion: the method this app is about
    "token_recycling": "#CC79A7",  # reddish purple
    "ar": "#6B6B6B",               # grey: the plain baseline
    "lookup": "#56B4E9",           # sky blue
    "racer_retrieval": "#0072B2",  # ablations keep their signal's colour
    "racer_logits": "#E69F00",
}
_METHOD_ALIASES = {
    "greedy": "ar", "autoregressive": "ar", "plain": "ar", "baseline": "ar",
    "tr": "token_recycling", "token-recycling": "token_recycling", "recycling": "token_recycling",
    "prompt_lookup": "lookup", "pld": "lookup", "prompt-lookup": "lookup",
    "racer-no-logits": "racer_retrieval", "racer_no_logits": "racer_retrieval",
    "racer-no-retrieval": "racer_logits", "racer_no_retrieval": "racer_logits",
}
_EXTRA_METHOD_COLORS = ("#009E73", "#000000", "#F0E442", "#882255", "#44AA99", "#999933")

#: Latency phases (stack order = the order a step runs in).
PHASES = ("draft", "forward", "verify", "cache", "update", "sizing")
PHASE_COLORS: dict[str, str] = {
    "draft": "#D55E00",
    "forward": "#404040",
    "verify": "#56B4E9",
    "cache": "#A6A6A6",
    "update": "#CC79A7",
    "sizing": "#F0E442",
}
PHASE_NAMES: dict[str, str] = {
    "draft": "draft (build the tree)",
    "forward": "forward (model verifies the tree)",
    "verify": "verify (pick the accepted path)",
    "cache": "cache (keep accepted KV)",
    "update": "update (automaton + copy-logit)",
    "sizing": "sizing (choose tree size)",
}

#: Fonts: tokens in a monospace font so label widths are predictable.
MONO_FONT = "DejaVu Sans Mono, Menlo, Consolas, Liberation Mono, monospace"
#: Advance width of one monospace cell, as a fraction of the font size (DejaVu/Menlo: 0.602).
MONO_ADVANCE = 0.62
SANS_FONT = "Inter, DejaVu Sans, Helvetica, Arial, sans-serif"


def source_color(source: str) -> str:
    return SOURCE_COLORS.get(source, "#999999")


def method_key(method: str) -> str:
    m = str(method).strip().lower().replace(" ", "_")
    return _METHOD_ALIASES.get(m, m)


def method_color(method: str, index: int = 0) -> str:
    """Colour of a decode method; unknown methods get a stable extra colour by `index`."""
    return METHOD_COLORS.get(method_key(method), _EXTRA_METHOD_COLORS[index % len(_EXTRA_METHOD_COLORS)])


def method_colors(methods: Iterable[str]) -> dict[str, str]:
    out, extra = {}, 0
    for m in methods:
        if method_key(m) in METHOD_COLORS:
            out[m] = METHOD_COLORS[method_key(m)]
        else:
            out[m] = _EXTRA_METHOD_COLORS[extra % len(_EXTRA_METHOD_COLORS)]
            extra += 1
    return out


def tint(color: str, alpha: float) -> str:
    """`color` (#rrggbb) blended onto white at `alpha` (an opaque hex colour)."""
    r, g, b = (int(color[i:i + 2], 16) for i in (1, 3, 5))
    mix = lambda c: round(255 - (255 - c) * alpha)  # noqa: E731
    return f"#{mix(r):02X}{mix(g):02X}{mix(b):02X}"


def rgba(color: str, alpha: float) -> str:
    r, g, b = (int(color[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def text_color_on(color: str) -> str:
    """Black or white, whichever reads better on `color` (#rrggbb or rgb(...))."""
    if color.startswith("#"):
        r, g, b = (int(color[i:i + 2], 16) for i in (1, 3, 5))
    else:
        r, g, b = (float(v) for v in color[color.index("(") + 1:color.index(")")].split(",")[:3])
    lin = [((c / 255) / 12.92) if c / 255 <= 0.04045 else (((c / 255) + 0.055) / 1.055) ** 2.4 for c in (r, g, b)]
    lum = 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]
    return "#000000" if lum > 0.22 else "#FFFFFF"


def highlight_color_map(sources: Iterable[str] = CORE_SOURCES) -> dict[str, str]:
    """`color_map` for a `gr.HighlightedText` showing `text_spans` output."""
    return {s: SOURCE_COLORS[s] for s in sources}


def legend_traces(sources: Iterable[str] = CORE_SOURCES, *, accepted: bool = True,
                  rejected: bool = True) -> list[go.Scatter]:
    """Invisible-data traces that put the shared colour code into a figure's legend."""
    traces = []
    for s in sources:
        traces.append(go.Scatter(
            x=[None], y=[None], mode="markers", name=SOURCE_NAMES.get(s, s),
            marker=dict(symbol="square", size=13, color=source_color(s), line=dict(width=0)),
            hoverinfo="skip", showlegend=True, meta={"role": "legend", "key": s}))
    if accepted:
        traces.append(go.Scatter(
            x=[None], y=[None], mode="lines", name="accepted path",
            line=dict(color=ACCEPTED_COLOR, width=ACCEPTED_WIDTH), hoverinfo="skip",
            meta={"role": "legend", "key": "accepted"}))
    if rejected:
        traces.append(go.Scatter(
            x=[None], y=[None], mode="lines", name="rejected branch",
            line=dict(color=REJECTED_COLOR, width=2), hoverinfo="skip",
            meta={"role": "legend", "key": "rejected"}))
    return traces


def legend_rows(names: Iterable[str], width: float, font_size: int = 12) -> int:
    """Rows a horizontal legend with these entries needs in `width` px (an estimate: plotly
    wraps a horizontal legend into columns as wide as its widest entry)."""
    names = list(names)
    if not names:
        return 0
    col = max(44 + 0.53 * font_size * len(n) for n in names)
    per_row = max(1, int(width // col))
    return -(-len(names) // per_row)


def top_margin(subtitle: str | None, legend_names: Iterable[str], width: float) -> int:
    """Top margin that fits the title, its subtitle lines and the legend rows above the plot."""
    sub_lines = 0 if not subtitle else subtitle.count("<br>") + 1
    return int(34 + 18 * sub_lines + 24 * legend_rows(legend_names, width) + 8)


class TraceList:
    """Collects traces; the figure is built once at the end (one validation pass, ~3x faster
    than adding traces and annotations to a live figure one by one)."""

    def __init__(self) -> None:
        self.data: list = []

    def add_trace(self, trace) -> None:
        self.data.append(trace)

    def figure(self, layout: dict) -> go.Figure:
        return go.Figure(data=self.data, layout=layout)


def base_layout(title: str, subtitle: str | None = None, *, legend_names: Iterable[str] | None = None,
                width: float | None = 900, **kw) -> dict:
    """Shared look: white background, readable fonts, title on top, then a horizontal legend
    just above the plot. With `legend_names` the top margin is sized to fit both."""
    t = dict(text=title, x=0.01, xanchor="left", xref="container", y=1.0, yref="container",
             yanchor="top", pad=dict(t=12), font=dict(size=17))
    if subtitle:
        t["subtitle"] = dict(text=subtitle, font=dict(size=12, color="#555555"))
    layout = dict(
        title=t, template="plotly_white", font=dict(family=SANS_FONT, size=13, color="#222222"),
        legend=dict(orientation="h", yanchor="bottom", y=1.0, yref="paper", xanchor="left", x=0.0,
                    font=dict(size=12), bgcolor="rgba(255,255,255,0.85)", traceorder="normal"),
        hoverlabel=dict(font=dict(family=MONO_FONT, size=12), bgcolor="white"),
        margin=dict(l=60, r=30, t=110, b=50),
    )
    if width:
        layout["width"] = int(width)
    layout.update(kw)
    if legend_names is not None:
        m = dict(layout["margin"])
        plot_w = (width or 900) - m.get("l", 0) - m.get("r", 0)
        m["t"] = top_margin(subtitle, legend_names, plot_w)
        layout["margin"] = m
    return layout
