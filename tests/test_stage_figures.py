"""The "anatomy of a step" figures, on real anatomy data: the tiny random model decoded with the
real RACER drafter and sizer (a synthetic cost curve, nothing measured), replayed and taken apart
by racer.anatomy. Each test checks what a figure claims against the data it was drawn from."""
from __future__ import annotations

import random

import pytest

from racer import DecodeConfig, DecodeRun, make_drafter
from racer import anatomy as A
from racer.costcurve import CostCurve
from racer.replay import Replay, Turn
from racer.sizing import Sizer
from racer.tiny import tiny_lm
from visuals import colors as C
from visuals import stage_common as SC
from visuals.attention_figure import attention_mask_figure, dfs_order
from visuals.candidates_figure import logits_tree_figure, merged_pool_figure, retrieval_candidates_figure
from visuals.match_figure import match_figure
from visuals.sizer_figure import sizer_figure
from visuals.verify_figure import verify_figure
from visuals.what_if_figure import what_if_figure, what_if_tree_figure

VOCAB = 96


def decode(t: int) -> str:
    return f"t{int(t)} "


class SteadySizer(Sizer):
    """Learns from fixed timings: sizing reacts to the clock, and the tests want the same trees
    on every machine (the replay uses the same class, so it reproduces the run)."""

    def observe(self, tree, accepted, timings, **kw):
        super().observe(tree, accepted, {"forward_ms": 12.0, "draft_ms": 1.0}, **kw)


@pytest.fixture(scope="module")
def trace():
    lm = tiny_lm(vocab=VOCAB)
    rng = random.Random(3)
    chunk = [rng.randrange(VOCAB) for _ in range(8)]
    prompt = (chunk + [rng.randrange(VOCAB) for _ in range(3)]) * 4
    curve = CostCurve([1, 8, 64], [16], [[10.0, 11.0, 40.0]], {})
    run = DecodeRun(lm, prompt, make_drafter("racer", vocab_size=VOCAB), DecodeConfig(max_new_tokens=60),
                    sizer=SteadySizer(curve))
    steps = list(run)
    replay = Replay([Turn(run.start, steps)], lambda: make_drafter("racer", vocab_size=VOCAB),
                    lambda: SteadySizer(curve))
    return steps, replay


@pytest.fixture(scope="module")
def anatomies(trace):
    _, replay = trace
    out = [A.anatomy(replay.before(k)) for k in range(len(replay.steps))]
    return [a for a in out if not a.get("final")]


@pytest.fixture(scope="module")
def rich(anatomies):
    """The step with the most to show: borders, a cut, a mismatch, a long accepted path."""
    return max(anatomies, key=lambda a: (len(a["match"]["borders"]) >= 2, a["verify"]["reason"] == "mismatch",
                                         a["merge"]["chosen_T"] < len(a["merge"]["pool"]["tokens"]),
                                         len(a["verify"]["accepted"])))


def by_role(fig, role):
    return [t for t in fig.data if t.meta and t.meta.get("role") == role]


def texts(fig):
    return " ".join(a.text or "" for a in fig.layout.annotations)


# -- stage 1 ---------------------------------------------------------------------------------

def test_match_has_one_bar_per_walk_node_spanning_its_depth(anatomies):
    for a in anatomies:
        m = a["match"]
        fig = match_figure(m, decode, width=860)
        meta = fig.layout.meta
        walk = [b for b in meta["bars"] if b["role"] == "walk"]
        assert [(b["node"], b["move"], b["depth"]) for b in walk] == \
            [(w["node"], w["move"], w["depth"]) for w in m["walk"]]
        seq = list(m["context_tail"]) + [m["root"]]
        for b, w in zip(walk, m["walk"]):
            assert b["last"] - b["first"] + 1 == b["depth"]
            # the tokens above the bar are the node's string; state/fail end with the text, goto at x0
            assert seq[b["first"]:b["last"] + 1] == list(w["tokens"])
            assert b["last"] == (len(seq) - 1 if w["move"] == "goto" else len(seq) - 2)
        shapes = {s.name: s for s in fig.layout.shapes if s.name}
        for k, b in enumerate(walk):
            s = shapes[f"walk {k}"]
            if b["depth"] > 0 and not meta["folded"]:
                assert s.x1 - s.x0 == pytest.approx(b["depth"] * meta["cell_w"] - 2)
        # borders: the arrival (framed) and one more bar per other border, all ending under x0
        borders = [b for b in meta["bars"] if b["border"]]
        assert [b["node"] for b in borders] == [b["node"] for b in m["borders"]]
        assert all(b["last"] == len(seq) - 1 and b["last"] - b["first"] + 1 == b["depth"] for b in borders)


def test_match_says_when_nothing_matched(anatomies):
    fallback = [a for a in anatomies if a["match"]["walk"][-1]["move"] == "fail"]
    assert fallback, "the tiny run has a step whose walk falls back to the trie root"
    fig = match_figure(fallback[0]["match"], decode, width=390)
    assert fig.layout.meta["root_fallback"]
    assert "nothing matched" in texts(fig) and "no borders" in texts(fig)


def test_match_folds_the_state_only_tokens_on_a_phone(anatomies):
    def reach(m):
        return max([w["depth"] for w in m["walk"][1:]] + [b["depth"] for b in m["borders"]])

    a = next(a for a in anatomies if reach(a["match"]) <= 6)
    fig = match_figure(a["match"], decode, width=340)
    meta = fig.layout.meta
    assert meta["folded"] >= 2 and meta["columns"] < meta["n_context"] + 1
    # folding changes the drawing, never the spans
    assert all(b["last"] - b["first"] + 1 == b["depth"] for b in meta["bars"])


# -- stage 5 ---------------------------------------------------------------------------------

@pytest.mark.parametrize("width", [340, 860])
def test_mask_cells_are_the_ancestors_plus_all_of_the_text(anatomies, width):
    for a in anatomies:
        att = a["attention"]
        fig = attention_mask_figure(att, decode, accepted=a["verify"]["accepted"], width=width)
        (mask,) = by_role(fig, "mask")
        meta = fig.layout.meta
        rows, cols = meta["rows"], meta["columns"]
        assert sorted(rows) == list(range(len(att["tree"]["tokens"]))) and rows == dfs_order(att["tree"]["parents"])
        for r, v in enumerate(rows):
            for c, col in enumerate(cols):
                filled = mask.z[r][c] > 0
                if col["kind"] == "tree":
                    assert filled == bool(att["ancestors"][v][col["node"]])
                else:
                    assert filled
        n_text = sum(col["kind"] != "tree" for col in cols)
        earlier = att["past"] - meta["tail_shown"]
        assert n_text == meta["tail_shown"] + (1 if earlier > 0 else 0)
        framed = [s for s in fig.layout.shapes if s.name and s.name.startswith("accepted row")]
        assert len(framed) == len(a["verify"]["accepted"])


# -- stages 2-4: candidate trees -------------------------------------------------------------

def _node_shapes(fig):
    return {int(s.name.split()[1]): s for s in fig.layout.shapes if s.name and s.name.startswith("node ")}


def _check_kept_solid_cut_hollow(fig):
    (nodes,) = by_role(fig, "nodes")
    kept, sources = nodes.meta["kept"], nodes.meta["sources"]
    shapes = _node_shapes(fig)
    for i, s in shapes.items():
        if kept[i]:
            assert s.fillcolor == C.source_color(sources[i]) and s.line.dash == "solid"
        else:
            assert s.fillcolor == SC.HOLLOW and s.line.dash == SC.CUT_DASH
    for t in by_role(fig, "dots_cut"):
        assert t.marker.color == SC.HOLLOW
    for t in by_role(fig, "dots_kept"):
        assert SC.HOLLOW not in list(t.marker.color)
    labelled = set(fig.layout.meta["labelled"])
    dots = sum(t.meta["count"] for t in by_role(fig, "dots_cut") + by_role(fig, "dots_kept"))
    assert set(shapes) == labelled and len(labelled) + dots == len(kept)
    return kept


def test_merged_pool_kept_nodes_solid_cut_nodes_hollow(rich):
    merge = rich["merge"]
    for width in (340, 860):
        fig = merged_pool_figure(merge, decode, width=width)
        kept = _check_kept_solid_cut_hollow(fig)
        drawn = fig.layout.meta["drawn"]
        assert kept == [merge["kept"][i] >= 0 for i in drawn]
        # every kept node is drawn; the rest are capped and counted
        assert {i for i, k in enumerate(merge["kept"]) if k >= 0} <= set(drawn)
        assert fig.layout.meta["not_drawn"] == len(merge["pool"]["tokens"]) - len(drawn)
        assert any(not k for k in kept), "a sized step has cut candidates to show"
        assert "cut by the sizer (hollow)" in [t.name for t in fig.data]


def test_retrieval_candidates_hang_below_x0(rich):
    ret = rich["retrieval"]
    fig = retrieval_candidates_figure(ret, decode, root=rich["root"], width=860)
    kept = _check_kept_solid_cut_hollow(fig)
    assert kept[1:] == [bool(c["kept"]) for c in ret["candidates"]][:len(kept) - 1]
    assert fig.layout.meta["depths"][1:] == [c["depth"] for c in ret["candidates"]][:len(kept) - 1]


def test_logits_layer_argument_limits_the_tree(rich):
    lg = rich["logits"]
    total = max(n["depth"] for n in lg["nodes"])
    assert total >= 3
    for layer in (1, 2, 3, None):
        fig = logits_tree_figure(lg, decode, root=rich["root"], layer=layer, width=860)
        meta = fig.layout.meta
        want = total if layer is None else layer
        assert max(meta["depths"]) == want == meta["layers_shown"]
        assert all(lg["nodes"][i]["depth"] <= want for i in meta["drawn"][1:])
        headers = [a.name for a in fig.layout.annotations if (a.name or "").startswith("header ")]
        assert headers == [f"header {d}" for d in range(want + 1)]
        _check_kept_solid_cut_hollow(fig)
    first = logits_tree_figure(lg, decode, root=rich["root"], layer=1, width=860)
    assert "layer 1</b><br>from x0's row" in texts(first)


def test_candidate_figures_say_when_a_stage_did_not_run():
    assert retrieval_candidates_figure(None, decode).layout.meta["empty"] == "off"
    assert retrieval_candidates_figure({"candidates": [], "borders": []}, decode).layout.meta["empty"] == "nothing"
    assert logits_tree_figure(None, decode).layout.meta["empty"] == "off"
    assert match_figure(None, decode).layout.meta["bars"] == []


# -- stage 4: the sizer ----------------------------------------------------------------------

def test_sizer_cut_sits_at_the_speed_peak(rich):
    merge = rich["merge"]
    fig = sizer_figure(merge, decode, width=860)
    (bars,) = by_role(fig, "bars")
    T = merge["chosen_T"]
    assert bars.meta["kept"][:T] == [True] * T and not any(bars.meta["kept"][T:])
    p = [merge["p_accept"][i] for i in bars.meta["order"]]
    assert p[1:T] == sorted(p[1:T], reverse=True) and bars.meta["order"][0] == 0
    cut = [s for s in fig.layout.shapes if s.type == "line" and s.x0 == s.x1]
    assert cut and cut[0].x0 == T + 0.5
    speed = next(t for t in fig.data if t.meta and t.meta.get("key") == "speed")
    assert list(speed.y) == pytest.approx([1000 * r for r in merge["rates"]][:len(speed.y)])
    if not merge["explore"]:
        assert fig.layout.meta["peak_T"] == T
    fixed = sizer_figure(dict(merge, auto=False), decode, width=340)
    assert fixed.layout.meta["fixed"] and "fixed tree size" in texts(fixed)


# -- stage 6: verify -------------------------------------------------------------------------

def test_verify_marks_the_stop(anatomies):
    seen = set()
    for a in anatomies:
        v, tree = a["verify"], a["attention"]["tree"]
        fig = verify_figure(v, decode, tree=tree, width=860)
        meta = fig.layout.meta
        assert meta["stop"] == v["last"] == v["accepted"][-1] and meta["reason"] == v["reason"]
        (ring,) = [s for s in fig.layout.shapes if s.name == "stop"]
        (nodes,) = by_role(fig, "nodes")
        x, y = nodes.x[v["last"]], nodes.y[v["last"]]
        assert ring.x0 < x < ring.x1 and ring.y0 < y < ring.y1
        words = {"mismatch": "model wants", "leaf": "the tree ends here", "limit": "the run ended here",
                 "end": "the run ended here"}[v["reason"]]
        assert words in texts(fig)
        if v["model_top"] is not None:
            assert texts(fig).count("model: ‘") >= len(tree["tokens"])
        (acc,) = by_role(fig, "accepted_edges")
        assert sum(1 for x in acc.x if x is None) == len(v["accepted"]) - 1
        seen.add(v["reason"])
    assert "mismatch" in seen


# -- what if ---------------------------------------------------------------------------------

def test_what_if_bars_are_the_committed_tokens(trace, rich):
    steps, replay = trace
    k = rich["step"]
    variants = [A.Variant(), A.Variant(retrieval=False), A.Variant(logits=False), A.Variant(capacity=8)]
    table = [A.what_if(replay.before(k), steps, v) for v in variants]
    fig = what_if_figure(table, decode, width=390)
    (bars,) = by_role(fig, "bars")
    assert list(bars.x) == [r["committed"] for r in table]
    assert list(bars.y) == ["as the run drafted it", "without retrieval", "without copy-logits", "fixed size 8"]
    assert table[0]["committed"] == len(rich["verify"]["committed"])      # the run's own tree replays the run
    one = what_if_tree_figure(table[1], decode, width=340, base=table[0]["variant"])
    (acc,) = by_role(one, "accepted_edges")
    assert acc.meta["segments"] == len(table[1]["path"]) - 1
    sampled = what_if_figure([dict(r, committed=None) for r in table], decode)
    assert sampled.layout.meta["sampling"]


# -- every figure, every width ---------------------------------------------------------------

def test_every_figure_builds_at_phone_and_desktop_widths(anatomies, rich):
    picks = {id(rich): rich, id(anatomies[0]): anatomies[0], id(anatomies[-1]): anatomies[-1]}
    for a in picks.values():
        for width in (340, 860):
            figs = [match_figure(a["match"], decode, width=width),
                    retrieval_candidates_figure(a["retrieval"], decode, root=a["root"], width=width),
                    logits_tree_figure(a["logits"], decode, root=a["root"], width=width),
                    logits_tree_figure(a["logits"], decode, root=a["root"], layer=2, width=width),
                    merged_pool_figure(a["merge"], decode, width=width),
                    sizer_figure(a["merge"], decode, width=width),
                    attention_mask_figure(a["attention"], decode, accepted=a["verify"]["accepted"], width=width),
                    verify_figure(a["verify"], decode, tree=a["attention"]["tree"], width=width)]
            for f in figs:
                assert f.layout.width == width and f.layout.height > 100
                assert f.layout.margin.t > 30
                # wrapped titles never run wider than the figure
                for line in (f.layout.title.text or "").split("<br>"):
                    assert len(line) * SC.SANS_ADVANCE * SC.TITLE_SIZE <= width
