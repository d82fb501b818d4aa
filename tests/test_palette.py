"""The one colour code (racer.palette): distinct for every reader, and the only one in use (CLI,
figures, app text and legends)."""
from __future__ import annotations

import html
import itertools
import re
import sys

import pytest

import racer
from racer import palette as P
from racer.tree import SOURCES
from racer_app import format as F
from visuals import colors as C
from visuals import samples as S
from visuals.automaton_figure import AGE_MAX, age_value, automaton_figure
from visuals.tree_figure import draft_tree_figure

# -- colour-vision simulation: Machado, Oliveira & Fernandes (2009), severity 1.0, linear RGB ----------

MACHADO = {
    "normal": None,
    "protanopia": ((0.152286, 1.052583, -0.204868), (0.114503, 0.786281, 0.099216), (-0.003882, -0.048116, 1.051998)),
    "deuteranopia": ((0.367322, 0.860646, -0.227968), (0.280085, 0.672501, 0.047413), (-0.011820, 0.042940, 0.968881)),
    "tritanopia": ((1.255528, -0.076749, -0.178779), (-0.078411, 0.930809, 0.147602), (0.004733, 0.691367, 0.303900)),
}
#: Smallest CIE76 difference between two source colours. Normal vision gets the stricter bound:
#: the old sky-blue "lookup" differed from retrieval blue mostly in lightness and read as its shade.
MIN_DE = {"normal": 30.0, "protanopia": 12.0, "deuteranopia": 12.0, "tritanopia": 12.0}


def _linear(c: float) -> float:
    c /= 255
    return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4


def lab(color: str, vision: str = "normal") -> tuple[float, float, float]:
    """CIE Lab (D65) of `color` as seen with `vision`."""
    rgb = [_linear(c) for c in P.hex_rgb(color)]
    m = MACHADO[vision]
    if m is not None:
        rgb = [min(1.0, max(0.0, sum(m[i][j] * rgb[j] for j in range(3)))) for i in range(3)]
    r, g, b = rgb
    x = (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047
    y = 0.2126 * r + 0.7152 * g + 0.0722 * b
    z = (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883
    f = [t ** (1 / 3) if t > (6 / 29) ** 3 else t / (3 * (6 / 29) ** 2) + 4 / 29 for t in (x, y, z)]
    return 116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])


def delta_e(a: str, b: str, vision: str = "normal") -> float:
    return sum((p - q) ** 2 for p, q in zip(lab(a, vision), lab(b, vision))) ** 0.5


def closest_pair(colors: dict[str, str], vision: str) -> tuple[float, str, str]:
    return min((delta_e(colors[a], colors[b], vision), a, b) for a, b in itertools.combinations(colors, 2))


@pytest.mark.parametrize("vision", list(MACHADO))
def test_source_colours_are_distinct_for_every_vision(vision):
    assert set(P.SOURCE_COLORS) == set(SOURCES)
    d, a, b = closest_pair(P.SOURCE_COLORS, vision)
    assert d >= MIN_DE[vision], f"{a} and {b} are only ΔE {d:.1f} apart under {vision}"


def test_the_distinctness_check_can_fail():
    old = dict(P.SOURCE_COLORS, lookup="#56B4E9")   # the old sky-blue prompt lookup
    d, a, b = closest_pair(old, "normal")
    assert {a, b} == {"retrieval", "lookup"} and d < MIN_DE["normal"]
    # a red/green pair that everyone else tells apart merges under deuteranopia
    red_green = {"red": "#D62728", "green": "#2CA02C"}
    assert closest_pair(red_green, "normal")[0] > 100
    assert closest_pair(red_green, "deuteranopia")[0] < MIN_DE["deuteranopia"]


def test_method_colours():
    src = P.SOURCE_COLORS
    assert P.method_color("racer") == "#D55E00" and "#D55E00" not in src.values()
    assert P.method_color("ar") == src["root"]
    assert P.method_color("pld") == P.method_color("hf-pld") == P.method_color("prompt lookup") == src["lookup"]
    assert P.method_color("racer-retrieval") == src["retrieval"] and P.method_color("racer-logits") == src["logits"]
    assert P.method_color("tr") == P.method_color("token_recycling") == "#000000"
    assert P.method_color("tr") not in (src["lookup"], src["template"])
    for e in P.EXTRA_COLORS:
        assert e not in src.values() and e not in P.METHOD_COLORS.values()
        assert min(delta_e(e, c) for c in src.values()) > 10
    assert C.method_colors(["racer-half", "hf"]) == {"racer-half": P.EXTRA_COLORS[0], "hf": P.EXTRA_COLORS[1]}


# -- the automaton's LRU age ------------------------------------------------------------------------

def _contrast(a: str, b: str) -> float:
    la, lb = (P.relative_luminance(*P.hex_rgb(c)) for c in (a, b))
    return (max(la, lb) + 0.05) / (min(la, lb) + 0.05)


def test_age_scale_is_grey_and_shares_no_colour_with_a_source():
    shades = [P.age_color(k / 50) for k in range(51)]
    assert not set(P.AGE_COLORS) & set(P.SOURCE_COLORS.values())   # no source colour is a stop
    for c in P.AGE_COLORS + tuple(shades):
        r, g, b = P.hex_rgb(c)
        assert r == g == b, f"{c} has a hue"
    # Every shade is without chroma and every source but root has plenty, so no hued source is on
    # the scale. (The root grey, the one source without a hue, lies between two stops; the
    # automaton shows no draft tokens.)
    chroma = lambda c: (lab(c)[1] ** 2 + lab(c)[2] ** 2) ** 0.5  # noqa: E731
    assert max(chroma(g) for g in shades) < 1
    assert min(chroma(c) for s, c in P.SOURCE_COLORS.items() if s != "root") > 30
    light = [lab(c)[0] for c in shades]
    assert light == sorted(light) and light[0] < 20 and light[-1] > 85   # fresh = dark, old = pale
    for c in shades:   # every label reads on its grey
        assert _contrast(c, P.text_color_on(c)) >= 4.5


def test_automaton_figure_uses_the_grey_age_scale():
    fig = automaton_figure(S.automaton_snapshot(), S.decode)
    nodes = next(t for t in fig.data if t.meta and t.meta.get("role") == "nodes")
    assert [list(s) for s in nodes.marker.colorscale] == [[p, c] for p, c in P.age_colorscale()]
    labels = [a for a in fig.layout.annotations if a.bgcolor and a.xref == "x"]
    assert labels and all(len(set(P.hex_rgb(a.bgcolor))) == 1 for a in labels)
    assert all(a.font.color == P.text_color_on(a.bgcolor) for a in labels)
    oldest = P.age_color(1.0)
    assert C.age_color(age_value(AGE_MAX) / age_value(AGE_MAX)) == oldest
    texts = " ".join(a.text or "" for a in fig.layout.annotations)
    assert "used N steps" in texts and "recycled" in texts
    fail = next(t for t in fig.data if t.meta and t.meta.get("role") == "fail_links")
    assert fail.line.color == P.FAIL_LINK_COLOR == "#D55E00" and fail.line.dash == "dash"
    assert P.BORDER_COLOR == P.SOURCE_COLORS["retrieval"] and P.STATE_COLOR == "#000000"


# -- the command line -------------------------------------------------------------------------------

_ANSI_BG = re.compile(r"\x1b\[48;2;(\d+);(\d+);(\d+)m")


def _hex_of_ansi(code: str) -> str:
    m = _ANSI_BG.search(code)
    assert m, repr(code)
    return P.rgb_hex(*(int(v) for v in m.groups()))


def test_cli_colours_come_from_the_palette():
    from racer import __main__ as cli
    assert cli.COLORS["root"] == ""
    for s in ("retrieval", "logits", "both", "lookup", "template"):
        assert _hex_of_ansi(cli.COLORS[s]) == P.SOURCE_COLORS[s]
    line = cli.legend_line()
    for s in ("retrieval", "logits", "both", "lookup", "template"):
        assert P.SOURCE_NAMES[s] in line and cli.COLORS[s] in line
    assert "magenta" not in line and "\x1b[3" not in line.replace("\x1b[38;2;", "")


@pytest.fixture
def cli_run(monkeypatch, capsys):
    """Run `python -m racer` on the tiny random model (no download) and return (stdout, stderr)."""
    from racer import __main__ as cli
    from racer.tiny import tiny_lm

    monkeypatch.setattr(racer, "load_model", lambda *a, **k: tiny_lm(vocab=96))
    monkeypatch.setattr(racer, "build_input_ids", lambda tok, prompt, system=None: [5, 6, 7, 8, 9] * 4)

    def run(*args: str, tty: bool = True) -> tuple[str, str]:
        monkeypatch.setattr(sys.stdout, "isatty", lambda: tty)
        assert cli.main(["a prompt", "--max-new-tokens", "24", "--capacity", "16", *args]) == 0
        out = capsys.readouterr()
        return out.out, out.err
    return run


def test_cli_colours_a_terminal_only(cli_run, monkeypatch):
    out, err = cli_run()
    painted = {_hex_of_ansi(m.group(0)) for m in _ANSI_BG.finditer(out)}
    assert painted and painted <= set(P.SOURCE_COLORS.values())
    assert P.SOURCE_NAMES["lookup"] in err
    for args, tty in ((("--no-color",), True), ((), False)):
        out, err = cli_run(*args, tty=tty)
        assert "\x1b[" not in out + err
    monkeypatch.setenv("NO_COLOR", "1")
    out, err = cli_run()
    assert "\x1b[" not in out + err


# -- figures and app text share it ------------------------------------------------------------------

def test_figures_and_app_text_use_the_palette():
    assert C.SOURCE_COLORS == P.SOURCE_COLORS
    assert F.TEXT_COLORS == P.SOURCE_COLORS
    assert C.METHOD_COLORS == P.METHOD_COLORS and C.PHASE_COLORS == P.PHASE_COLORS
    assert C.ACCEPTED_COLOR == P.ACCEPTED_COLOR and C.REJECTED_COLOR == P.REJECTED_COLOR
    for s in SOURCES:   # coloured text: the palette colour itself, or (root only) a pale tint of it
        shown = F.text_color_map()[s]
        assert shown == P.SOURCE_COLORS[s] or (s == "root" and shown == C.tint(P.SOURCE_COLORS[s], 0.18))
        assert F.text_color_map(current=True)[F.CURRENT + s] in (P.SOURCE_COLORS[s], C.tint(P.SOURCE_COLORS[s], 0.66))
    assert "border-color:#000000" in F.lane_header_html("tr")
    assert f"border-color:{P.method_color('racer')}" in F.lane_header_html("racer")


def test_html_legend_lists_every_source_in_plain_words():
    page = F.legend_html()
    for s in SOURCES:
        assert html.escape(P.SOURCE_LONG_NAMES[s]) in page
    assert "prompt lookup (copied from an earlier occurrence)" in page


def _legend(fig) -> list[str]:
    return [t.meta["key"] for t in fig.data if t.meta and t.meta.get("role") == "legend"]


def test_draft_tree_legend_lists_every_source_the_drafter_can_add():
    step = S.step_record()   # a RACER step: its drafter reports a prompt-lookup chain
    assert "lookup" not in step.tree.sources
    keys = _legend(draft_tree_figure(step, S.decode))
    assert {"root", "retrieval", "logits", "both", "lookup"} <= set(keys) and "template" not in keys
    tr = S.small_step_record()
    tr.info = {"template_nodes": 80}   # Token Recycling's step info
    assert "template" in _legend(draft_tree_figure(tr, S.decode))
    pld = S.small_step_record()
    pld.tree.sources[-1] = "lookup"   # a lookup node with no info at all
    assert "lookup" in _legend(draft_tree_figure(pld, S.decode))
