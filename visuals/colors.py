"""The one colour code of RACER Studio in plotly terms, and the legend that explains it.

Every colour comes from `racer.palette` (the command line uses the same one); this module only
adds what figures need on top: line widths, the age scale in plotly's format, legend traces and
the shared layout. Meanings:

* **root**      — the token the model itself fixed (always accepted): grey.
* **retrieval** — proposed by the Aho–Corasick automaton ("seen before in the context"): blue.
* **logits**    — proposed by the copy-logit table ("what the model predicted last time"): orange.
* **both**      — proposed by both signals (their paths merged in the tree): bluish green.
* **lookup**    — prompt lookup, copied from an earlier occurrence: reddish purple.
* **template**  — Token Recycling's fixed template tree: yellow.
* **accepted**  — the path the model agreed with (drawn thick and black).
* **rejected**  — everything else in the tree (faded).

The hues are from the Okabe–Ito palette, which stays distinguishable under the common
colour-vision deficiencies; the accepted path is black and thick, so it never depends on hue.
The automaton's LRU age is a grey scale (dark = just used, pale = next to be recycled), so it
never reads as a source.
"""
from __future__ import annotations

import json
from functools import lru_cache
from typing import Any, Iterable

import plotly.graph_objects as go
import plotly.io as pio

from racer import palette as P

#: Node/token colour by source (keys = `racer.tree.SOURCES`).
SOURCE_COLORS: dict[str, str] = dict(P.SOURCE_COLORS)
#: Human-readable names for the legend and for coloured text.
SOURCE_NAMES: dict[str, str] = dict(P.SOURCE_NAMES)
#: The four sources RACER's paper drafter produces: always shown in legends so the code is stable.
CORE_SOURCES = ("root", "retrieval", "logits", "both")

ACCEPTED_COLOR = P.ACCEPTED_COLOR   # accepted path: black, thick
REJECTED_COLOR = P.REJECTED_COLOR   # rejected branches: faded grey
ACCEPTED_WIDTH = 4.0
REJECTED_WIDTH = 1.3

#: Automaton figure.
TRIE_EDGE_COLOR = P.TRIE_EDGE_COLOR
FAIL_LINK_COLOR = P.FAIL_LINK_COLOR  # dashed
STATE_COLOR = P.STATE_COLOR
BORDER_COLOR = P.BORDER_COLOR        # borders feed the retrieval tree: retrieval blue
#: LRU age colour scale (fresh = dark grey, old = pale grey); fixed across steps.
AGE_COLORSCALE: list[list[Any]] = P.age_colorscale()
age_color = P.age_color

#: Decode methods (race, acceptance, latency, benchmark figures), by racer's method names.
METHOD_COLORS: dict[str, str] = dict(P.METHOD_COLORS)

#: Latency phases (stack order = the order a step runs in).
PHASES = ("draft", "forward", "verify", "cache", "update", "sizing")
PHASE_COLORS: dict[str, str] = dict(P.PHASE_COLORS)
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


method_key = P.method_key
method_color = P.method_color
text_color_on = P.text_color_on


def method_colors(methods: Iterable[str]) -> dict[str, str]:
    """Colour of each method; the unknown ones take the extra colours in turn."""
    out, extra = {}, 0
    for m in methods:
        if method_key(m) in METHOD_COLORS:
            out[m] = METHOD_COLORS[method_key(m)]
        else:
            out[m] = P.EXTRA_COLORS[extra % len(P.EXTRA_COLORS)]
            extra += 1
    return out


def legend_sources(present: Iterable[str], infos: Iterable[dict] = ()) -> list[str]:
    """Sources a legend lists: CORE_SOURCES, then lookup and template when the picture can hold them.
    The drafters say so in their step info (RACER reports its prompt-lookup chain, "chain_len";
    Token Recycling its "template_nodes"), so the legend lists them at every step of such a run,
    not only at the steps that kept such a node, and stays put while stepping."""
    present = set(present)
    for info in infos:
        if "chain_len" in (info or {}):
            present.add("lookup")
        if "template_nodes" in (info or {}):
            present.add("template")
    return list(CORE_SOURCES) + [s for s in ("lookup", "template") if s in present]


def tint(color: str, alpha: float) -> str:
    """`color` (#rrggbb) blended onto white at `alpha` (an opaque hex colour)."""
    r, g, b = (int(color[i:i + 2], 16) for i in (1, 3, 5))
    mix = lambda c: round(255 - (255 - c) * alpha)  # noqa: E731
    return f"#{mix(r):02X}{mix(g):02X}{mix(b):02X}"


def rgba(color: str, alpha: float) -> str:
    r, g, b = (int(color[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


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


#: The trace types the figures draw: the template keeps plotly_white's defaults for these only.
TRACE_TYPES = ("scatter", "bar", "heatmap")


@lru_cache(maxsize=1)
def _white_template_json() -> str:
    t = pio.templates["plotly_white"].to_plotly_json()
    return json.dumps({"data": {k: v for k, v in t["data"].items() if k in TRACE_TYPES},
                       "layout": {k: v for k, v in t["layout"].items()
                                  if k not in ("geo", "mapbox", "polar", "scene", "ternary")}})


def white_template() -> dict:
    """plotly_white as the figures use it, as plain JSON (a fresh copy each call): its layout
    without the 3-D, map and polar parts and its defaults for TRACE_TYPES only. The whole named
    template is 7 KB that plotly validates and deep-copies into every figure, 8-10 ms a figure on a
    2-core CPU, a third of each step the inspector renders, and 7 KB more sent to the page; this
    one takes 2.5-3 ms and 2.4 KB, and draws these figures exactly alike."""
    return json.loads(_white_template_json())


@lru_cache(maxsize=1)
def white_template_object() -> go.layout.Template:
    """`white_template` built once as plotly's object, for layouts: plotly copies an object (or a
    name) into a figure, but merges a dict into the figure's template key by key, which took
    50 ms in `update_layout`."""
    return go.layout.Template(white_template())


def blank_figure() -> go.Figure:
    """An empty figure on the white template (a bare go.Figure() first copies in plotly's full
    default template)."""
    return go.Figure(layout={"template": white_template_object()})


def base_layout(title: str, subtitle: str | None = None, *, legend_names: Iterable[str] | None = None,
                width: float | None = 900, **kw) -> dict:
    """Shared look: white background, readable fonts, title on top, then a horizontal legend
    just above the plot. With `legend_names` the top margin is sized to fit both."""
    t = dict(text=title, x=0.01, xanchor="left", xref="container", y=1.0, yref="container",
             yanchor="top", pad=dict(t=12), font=dict(size=17))
    if subtitle:
        t["subtitle"] = dict(text=subtitle, font=dict(size=12, color="#555555"))
    layout = dict(
        title=t, template=white_template_object(), font=dict(family=SANS_FONT, size=13, color="#222222"),
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
