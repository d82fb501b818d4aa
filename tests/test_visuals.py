"""Figure builders: expected traces, counts and colours on fixture step records (no rendering)."""
import json
import random

import plotly.graph_objects as go
import pytest

from racer.records import StepRecord
from visuals import (acceptance_by_source, acceptance_histogram, automaton_figure, benchmark_figure, cost_figure,
                     draft_tree_figure, latency_figure, race_figure, select_neighbourhood, step_boundaries,
                     text_spans, tree_layout)
from visuals import colors as C
from visuals import samples as S
from visuals.automaton_figure import AGE_MAX, age_value
from visuals.race_figure import method_name, race_figure_spec
from visuals.layout import collisions, tidy_positions
from visuals.tokens import cells, truncate, visible
from visuals.tree_figure import label_boxes


# ----------------------------------------------------------------------------- helpers

def trace(fig, role):
    found = [t for t in fig.data if t.meta and t.meta.get("role") == role]
    assert len(found) == 1, f"{role}: {len(found)} traces"
    return found[0]


def segments(tr):
    """Polyline segments in a trace that separates them with None."""
    xs = list(tr.x or [])
    return sum(1 for i, x in enumerate(xs) if x is None and i > 0 and xs[i - 1] is not None)


def legend_names(fig):
    return [t.name for t in fig.data if t.meta and t.meta.get("role") == "legend"]


def layout_of(step, decode=S.decode, **kw):
    t = step.tree
    return tree_layout(t.tokens, t.parents, t.depths, step.accepted, decode, next_root=step.next_root, **kw)


@pytest.fixture(scope="module")
def step64():
    return S.step_record()


@pytest.fixture(scope="module")
def snapshot():
    return S.automaton_snapshot()


# ----------------------------------------------------------------------------- tokens, layout

def test_whitespace_made_visible_and_widths():
    assert visible(" a\nb\tc") == "·a⏎b⇥c"
    assert visible("") == "∅"
    assert visible("\x00") == "\\x00"
    assert cells("的的") == 4 and cells("ab") == 2
    assert truncate("·implementation", 6) == "·impl…" and cells(truncate("的的的的", 5)) <= 5


def test_tidy_layout_parents_centred_no_overlap_no_crossing():
    rng = random.Random(3)
    for _ in range(30):
        n = rng.randrange(2, 80)
        parents = [-1] + [rng.randrange(i) for i in range(1, n)]
        sizes = [rng.uniform(8, 60) for _ in range(n)]
        pos = tidy_positions(parents, sizes, gap=5)
        kids = [[] for _ in range(n)]
        depth = [0] * n
        for i in range(1, n):
            kids[parents[i]].append(i)
            depth[i] = depth[parents[i]] + 1
        for v in range(n):
            if kids[v]:
                assert pos[v] == pytest.approx((pos[kids[v][0]] + pos[kids[v][-1]]) / 2)
        by_depth = {}
        for i in range(n):
            by_depth.setdefault(depth[i], []).append(i)
        for d, nodes in by_depth.items():
            nodes.sort(key=lambda i: pos[i])
            for a, b in zip(nodes, nodes[1:]):
                assert pos[b] - sizes[b] / 2 >= pos[a] + sizes[a] / 2 + 5 - 1e-6   # gap kept
            if d > 0:   # no crossings: parents appear in the same order as their children
                par_order = [parents[i] for i in nodes]
                assert [pos[p] for p in par_order] == sorted(pos[p] for p in par_order)


@pytest.mark.parametrize("orientation", ["auto", "lr"])
def test_64_node_tree_labels_do_not_collide(step64, orientation):
    assert len(step64.tree) == 64
    lay = layout_of(step64, width=900, margin_lr=40, orientation=orientation)
    assert not lay.compact
    boxes = label_boxes(lay)
    assert len(boxes) == 65                       # every node + the next-root box
    assert collisions(boxes) == []
    # everything is inside the plot area (layout pixels = screen pixels)
    assert min(b[0] for b in boxes) >= lay.x_range[0] and max(b[2] for b in boxes) <= lay.x_range[1]


def test_small_tree_is_top_down_and_roomy():
    lay = layout_of(S.small_step_record(), width=900, margin_lr=40)
    assert lay.orientation == "tb" and lay.font_size >= 12
    assert collisions(label_boxes(lay)) == []


# ----------------------------------------------------------------------------- draft tree

def test_tree_figure_traces_counts_and_colours(step64):
    fig = draft_tree_figure(step64, S.decode)
    n_acc = len(step64.accepted) - 1
    acc = trace(fig, "accepted_edges")
    assert segments(acc) == n_acc == 4
    assert acc.line.color == C.ACCEPTED_COLOR and acc.line.width == C.ACCEPTED_WIDTH
    rej = trace(fig, "rejected_edges")
    assert segments(rej) == len(step64.tree) - 1 - n_acc
    assert rej.line.color == C.REJECTED_COLOR
    nodes = trace(fig, "nodes")
    assert len(nodes.x) == 64
    assert list(nodes.marker.color) == [C.SOURCE_COLORS[s] for s in step64.tree.sources]
    # one box per node + the next root; accepted boxes framed black, filled with their source colour
    ann = [a for a in fig.layout.annotations if a.xref == "x"]
    assert len(ann) == 65
    framed = [a for a in ann if a.bordercolor == C.ACCEPTED_COLOR]
    assert len(framed) == len(step64.accepted)
    assert {a.bgcolor for a in framed} <= set(C.SOURCE_COLORS.values())
    # the full colour code is in the legend
    names = legend_names(fig)
    for s in C.CORE_SOURCES:
        assert C.SOURCE_NAMES[s] in names
    assert "accepted path" in names and "rejected branch" in names
    assert fig.layout.meta["label_boxes"] and collisions(fig.layout.meta["label_boxes"]) == []
    assert trace(fig, "next_edge").line.dash == "dot"


def test_tree_hover_has_the_facts(step64):
    fig = draft_tree_figure(step64, S.decode)
    hover = trace(fig, "nodes").hovertemplate
    acc_node = step64.accepted[2]
    h = hover[acc_node]
    for key in ("token id: ", "source: ", "rank: ", "depth: ", "breadth: ", "retrieval freq: ", "accepted"):
        assert key in h
    assert f"token id: {step64.tree.tokens[acc_node]}" in h
    rejected = next(i for i in range(1, 64) if i not in step64.accepted)
    assert "rejected" in hover[rejected]


def test_tree_hover_shows_the_copy_logit_probability(step64):
    import copy
    step = copy.deepcopy(step64)
    step.tree.meta[1]["p_row"] = 0.4321
    step.tree.meta[2]["p_row"] = -1.0  # written without probabilities: not shown
    hover = trace(draft_tree_figure(step, S.decode), "nodes").hovertemplate
    assert "probability in its copy-logit row: 0.43" in hover[1]
    assert "copy-logit row" not in hover[2]


def test_tree_hover_shows_the_lookup_match_run(step64):
    import copy
    step = copy.deepcopy(step64)
    step.tree.meta[1]["run"] = 17      # a chain node: sizing judges it by this
    step.tree.meta[2].pop("run", None)
    hover = trace(draft_tree_figure(step, S.decode), "nodes").hovertemplate
    assert "lookup match agrees 17 tokens back" in hover[1]
    assert "lookup match" not in hover[2]


def test_tree_labels_escape_and_show_whitespace():
    rec = S.small_step_record()
    fig = draft_tree_figure(rec, S.decode)
    texts = [a.text for a in fig.layout.annotations if a.xref == "x"]
    assert any("·&lt;" in t for t in texts)   # " <" : visible space, escaped bracket
    assert any("⏎" in t for t in texts)


def test_large_tree_labels_only_the_accepted_path():
    big = S.big_step_record()
    assert len(big.tree) > 64
    fig = draft_tree_figure(big, S.decode)
    assert fig.layout.meta["compact"]
    boxes = [a for a in fig.layout.annotations if a.xref == "x"]
    assert len(boxes) == len(big.accepted) + 1          # the accepted path + the next root
    assert segments(trace(fig, "accepted_edges")) == len(big.accepted) - 1
    assert len(trace(fig, "nodes").x) == len(big.tree)  # every node still hoverable


def test_tree_accepts_dicts_and_root_only_steps(step64):
    fig = draft_tree_figure(step64.to_dict(), S.decode)
    assert segments(trace(fig, "accepted_edges")) == 4
    from racer.tree import DraftTree
    final = StepRecord(9, 3, DraftTree.root_only(3), [0], [3], None, 10, {}, forwarded=False)
    fig = draft_tree_figure(final, S.decode)
    assert segments(trace(fig, "accepted_edges")) == 0 and len(trace(fig, "nodes").x) == 1


# ----------------------------------------------------------------------------- automaton

def test_sample_snapshot_failure_links_are_correct(snapshot):
    brute = S.brute_fail(snapshot)
    assert all(n["fail"] == brute[n["id"]] for n in snapshot["nodes"] if n["id"] != 0)


def test_neighbourhood_is_small_and_closed(snapshot):
    ids = select_neighbourhood(snapshot, 36)
    assert 20 <= len(ids) <= 36
    by = {n["id"]: n for n in snapshot["nodes"]}
    s = set(ids)
    assert snapshot["state"] in s and set(snapshot["borders"]) <= s
    for v in ids:
        assert by[v]["parent"] in s or by[v]["parent"] == -1
        assert by[v]["fail"] in s or by[v]["fail"] == -1


def test_automaton_figure(snapshot):
    fig = automaton_figure(snapshot, S.decode)
    drawn = fig.layout.meta["drawn"]
    assert 20 <= len(drawn) <= 40
    by = {n["id"]: n for n in snapshot["nodes"]}
    expected_links = sum(1 for v in drawn if by[v]["fail"] not in (0, -1))
    fl = trace(fig, "fail_links")
    assert fig.layout.meta["fail_links"] == expected_links == segments(fl) > 0
    assert fl.line.dash == "dash"
    arrows = [a for a in fig.layout.annotations if a.showarrow]
    assert len(arrows) == expected_links
    brute = S.brute_fail(snapshot)
    assert all(brute[v] == f for v, f in fig.layout.meta["links"])
    te = trace(fig, "trie_edges")
    assert segments(te) == len(drawn) - 1 and not te.line.dash
    # LRU age: fixed scale with a colour bar
    nodes = trace(fig, "nodes")
    assert nodes.marker.showscale and nodes.marker.cmin == 0 and nodes.marker.cmax == pytest.approx(age_value(AGE_MAX))
    ages = {n["id"]: n["age"] for n in snapshot["nodes"]}
    assert list(nodes.marker.color) == [pytest.approx(age_value(ages[v])) for v in drawn]
    # state and borders are framed; evictions and capacity are in the captions
    frames = [sh for sh in fig.layout.shapes if sh.type == "rect"]
    assert len(frames) == len(set(snapshot["borders"]) | {snapshot["state"]})
    assert sum(1 for sh in frames if sh.line.color == C.STATE_COLOR) == 1
    texts = " ".join(a.text or "" for a in fig.layout.annotations)
    assert "Evicted this step (2" in texts and "«·cat·sat·on»" in texts
    assert "9,734 / 10,000" in fig.layout.title.subtitle.text
    names = [t.name for t in fig.data if t.name]
    assert any("match state" in n for n in names) and any("border" in n for n in names)
    assert any("failure link" in n for n in names) and any("trie edge" in n for n in names)


def test_automaton_prunes_large_snapshots(snapshot):
    fig = automaton_figure(snapshot, S.decode, max_nodes=20)
    assert len(fig.layout.meta["drawn"]) <= 24   # the core (state, borders, closure) always stays
    assert fig.layout.meta["fail_links"] == segments(trace(fig, "fail_links"))


# ----------------------------------------------------------------------------- text spans

def test_text_spans_cover_the_text_with_step_boundaries():
    steps = S.decode_steps()
    spans, step_of = text_spans(steps, S.decode, prompt_ids=[1, 2])
    assert len(spans) == len(step_of)
    assert spans[0] == (" the cat", None) and step_of[0] == -1
    committed = [t for s in steps for t in s.committed]
    assert "".join(t for t, _ in spans[1:]) == "".join(S.decode(t) for t in committed)
    assert {lab for _, lab in spans[1:]} <= set(C.CORE_SOURCES)
    # regroup by step: each step's text is its committed tokens, and it starts with a root span
    for s in steps:
        parts = [spans[i] for i in range(len(spans)) if step_of[i] == s.index]
        assert "".join(t for t, _ in parts) == "".join(S.decode(t) for t in s.committed)
        assert parts[0][1] == "root"
    assert len(step_boundaries(step_of)) == len(steps) + 1
    assert set(C.highlight_color_map()) == set(C.CORE_SOURCES)


def test_text_spans_token_sources_follow_the_tree(step64):
    spans, step_of = text_spans([step64], S.decode, merge=False)
    assert [lab for _, lab in spans] == ["root"] + [step64.tree.sources[i] for i in step64.accepted[1:]]


def test_text_spans_decode_many_joins_split_characters():
    # a byte-level tokenizer: "é" is two tokens; decoding them one by one gives U+FFFD
    vocab = {1: b"caf", 2: b"\xc3", 3: b"\xa9", 4: b"!"}

    def decode_many(ids):
        return b"".join(vocab[i] for i in ids).decode("utf-8", errors="replace")
    from racer.tree import DraftTree
    t = DraftTree.root_only(1)
    a = t.add(0, 2, "retrieval", 0)
    b = t.add(a, 3, "logits", 0)
    rec = StepRecord(0, 1, t, [0, a, b], [1, 2, 3], 4, 5, {})
    rec2 = StepRecord(1, 4, DraftTree.root_only(4), [0], [4], None, 8, {})
    spans, step_of = text_spans([rec, rec2], decode_many=decode_many)
    assert "".join(s for s, _ in spans) == "café!"
    assert step_of == sorted(step_of)


# ----------------------------------------------------------------------------- whole-run figures

def test_race_figure():
    race = S.race_data()
    fig = race_figure(race)
    lines = [t for t in fig.data if t.meta and t.meta.get("role") == "race"]
    assert [t.meta["method"] for t in lines] == list(race)
    for t in lines:
        final = race[t.meta["method"]]["final"]
        assert f"{final['tokens_per_s']:.1f} tok/s" in t.name and f"MAT {final['mat']:.2f}" in t.name
        assert t.line.color == C.method_color(t.meta["method"])
        assert list(t.y) == [p[1] for p in race[t.meta["method"]]["points"]]
    assert len(fig.layout.annotations) == len(race)


@pytest.mark.parametrize("prefill_s", [None, 0.12])
def test_the_race_figure_streamed_as_plain_json_is_what_plotly_writes(prefill_s):
    """A live race sends race_figure_spec's dict as it is, without plotly's validation: it must be
    valid plotly and exactly what plotly itself would write for it."""
    race = S.race_data()
    spec = race_figure_spec(race, prefill_s=prefill_s)
    assert json.loads(race_figure(race, prefill_s=prefill_s).to_json()) == json.loads(json.dumps(spec))
    texts = [a["text"] for a in spec["layout"]["annotations"]]
    # Every method keeps its end label beside the prefill's (plotly's update_layout had merged the
    # first label into the prefill's annotation and lost it).
    assert texts[:1] == (["prefill"] if prefill_s else texts[:1])
    assert sorted(t.split("</b>")[0] for t in texts if t != "prefill") == sorted(
        f"<b>{method_name(m)}" for m in race)
    assert spec["layout"]["template"] == json.loads(race_figure(race).to_json())["layout"]["template"]


@pytest.mark.parametrize("viewport", [None, 1200, 640, 360])
def test_fluid_spec_is_fluid_for_plain_json(viewport):
    from racer_app.inspector import fluid, fluid_spec
    spec = race_figure_spec(S.race_data(), prefill_s=0.1, title="A long title that a phone cannot show in full")
    want = json.loads(fluid(go.Figure(spec), viewport).to_json())
    assert json.loads(json.dumps(fluid_spec(spec, viewport))) == want
    assert bool(want["layout"]["title"]["subtitle"]["text"]) == (viewport is None or viewport >= 700)
    assert want["layout"]["title"]["text"].endswith("…") == (viewport == 360)


def test_the_lean_template_draws_every_figure_as_plotly_white_does():
    """Every figure keeps plotly_white's look through the lean template: it uses only the trace
    types whose defaults the template keeps, and those defaults and the 2-D layout are plotly_white's."""
    from visuals.gallery import build
    import plotly.io as pio
    full = pio.templates["plotly_white"].to_plotly_json()
    lean = C.white_template()
    assert lean["data"] == {k: full["data"][k] for k in C.TRACE_TYPES}
    assert all(lean["layout"][k] == v for k, v in full["layout"].items() if k in lean["layout"])
    figs, _ = build(with_model=True)
    used = {t.type for f in figs.values() for t in f.data}
    assert used and used <= set(C.TRACE_TYPES), used - set(C.TRACE_TYPES)
    assert all(f.layout.template.to_plotly_json() == lean for f in figs.values() if f.layout.title.text)


def test_acceptance_histogram():
    data = S.accept_lengths()
    fig = acceptance_histogram(data)
    assert len(fig.data) == len(data)
    for t in fig.data:
        ls = data[t.meta["method"]]
        assert sum(t.y) == pytest.approx(1.0)
        assert t.meta["mat"] == pytest.approx(sum(ls) / len(ls))
        assert sum(t.customdata) == len(ls)
    ar = next(t for t in fig.data if t.meta["method"] == "ar")
    assert ar.y[0] == 1.0


def test_acceptance_by_source():
    steps = S.decode_steps()
    fig = acceptance_by_source(steps)
    bars = [t for t in fig.data if t.meta and t.meta.get("role") == "source"]
    assert [t.meta["key"] for t in bars][0] == "root"
    for t in bars:
        assert t.marker.color == C.SOURCE_COLORS[t.meta["key"]]
    totals = [sum(t.y[i] for t in bars) for i in range(len(steps))]
    assert totals == [len(s.committed) for s in steps]
    root = next(t for t in bars if t.meta["key"] == "root")
    assert list(root.y) == [1] * len(steps)


def test_latency_figure_per_token_and_from_steps():
    runs = S.latency_data()
    fig = latency_figure(runs)
    fwd = next(t for t in fig.data if t.meta["key"] == "forward")
    assert list(fwd.x) == pytest.approx([r["timings"]["forward_ms"] / r["new_tokens"] for r in runs.values()])
    assert fwd.marker.color == C.PHASE_COLORS["forward"]
    assert [t.meta["key"] for t in fig.data] == [p for p in C.PHASES if any(
        r["timings"].get(p + "_ms") for r in runs.values())]
    steps = S.decode_steps()
    fig2 = latency_figure({"racer": steps}, per="step")
    d = next(t for t in fig2.data if t.meta["key"] == "draft")
    assert d.x[0] == pytest.approx(sum(s.timings["draft_ms"] for s in steps) / len(steps))


def test_cost_figure():
    curve = S.cost_curve()
    fig = cost_figure(curve)
    ms = trace(fig, "ms")
    assert list(ms.x) == curve["sizes"] and list(ms.y) == curve["ms"]
    tps = trace(fig, "tps")
    assert tps.yaxis == "y2"
    assert list(tps.y) == pytest.approx([1000 * e / t for e, t in zip(curve["expected_tokens"], curve["ms"])])
    chosen = trace(fig, "chosen")
    assert list(chosen.x) == [curve["chosen_T"]]
    assert any(sh.x0 == curve["chosen_T"] for sh in fig.layout.shapes)
    no_e = cost_figure({"sizes": [1, 8, 16], "ms": [10.0, 12.0, 15.0], "chosen_T": 8})
    assert [t.meta["role"] for t in no_e.data] == ["ms", "chosen"]


def test_benchmark_figure():
    summ = S.benchmark_summary()
    fig = benchmark_figure(summ)
    mats = [t for t in fig.data if t.meta["role"] == "mat"]
    sps = [t for t in fig.data if t.meta["role"] == "speedup"]
    assert len(mats) == len(sps) == len(summ["methods"])
    cats = list(summ["methods"]["racer"]["categories"])
    for t in mats:
        d = summ["methods"][t.meta["method"]]
        assert len(t.x) == len(cats) + 1 and "overall" in t.x[-1]
        assert list(t.y) == pytest.approx([d["categories"][c]["mat"] for c in cats] + [d["overall"]["mat"]])
        assert t.marker.color == C.method_color(t.meta["method"])
    assert any(getattr(sh, "y0", None) == 1.0 for sh in fig.layout.shapes)


def test_palette_is_distinct():
    core = [C.SOURCE_COLORS[s] for s in C.CORE_SOURCES]
    assert len(set(core + [C.ACCEPTED_COLOR, C.REJECTED_COLOR])) == 6
    assert C.text_color_on("#000000") == "#FFFFFF" and C.text_color_on("#FFFFFF") == "#000000"


# ----------------------------------------------------------------------------- real records (tiny model)

@pytest.fixture(scope="module")
def tiny_steps():
    from visuals.gallery import tiny_model_steps
    steps, result = tiny_model_steps(max_new_tokens=40)
    return steps, result


def tiny_decode(t):
    return f"t{t} "


def test_real_steps_draw(tiny_steps):
    steps, result = tiny_steps
    assert any(len(s.tree) > 1 for s in steps)
    for s in steps:
        fig = draft_tree_figure(s, tiny_decode)
        assert segments(trace(fig, "accepted_edges")) == len(s.accepted) - 1
        assert len(trace(fig, "nodes").x) == len(s.tree)
        if not fig.layout.meta["compact"]:
            assert collisions(fig.layout.meta["label_boxes"]) == []
    spans, step_of = text_spans(steps, tiny_decode)
    assert "".join(t for t, _ in spans) == "".join(tiny_decode(t) for t in result.token_ids)
    by_src = acceptance_by_source(steps)
    assert sum(sum(t.y) for t in by_src.data if t.meta and t.meta.get("role") == "source") == len(result.token_ids)


def test_real_automaton_snapshots_draw(tiny_steps):
    steps, _ = tiny_steps
    snaps = [s.info["automaton"] for s in steps if s.info.get("automaton")]
    assert snaps
    for snap in snaps:
        fig = automaton_figure(snap, tiny_decode)
        drawn = set(fig.layout.meta["drawn"])
        assert len(drawn) <= 40 and snap["state"] in drawn
        by = {n["id"]: n for n in snap["nodes"]}
        # every drawn link joins two drawn nodes and is the node's failure link
        for v, f in fig.layout.meta["links"]:
            assert v in drawn and f in drawn and by[v]["fail"] == f
        expected = sum(1 for v in drawn if by[v]["fail"] not in (0, -1) and by[v]["fail"] in drawn)
        assert fig.layout.meta["fail_links"] == expected


def test_empty_inputs_do_not_crash():
    assert automaton_figure({"nodes": []}).layout.meta["drawn"] == []
    assert automaton_figure(None).layout.meta["fail_links"] == 0
    race_figure({})
    acceptance_histogram({"racer": []})
    acceptance_by_source([])
    latency_figure({})
    benchmark_figure({"methods": {}})
    assert text_spans([]) == ([], [])


def test_cost_curve_from_a_sized_step():
    from visuals import cost_curve_from_step

    class Curve:
        sizes = [1, 8, 64]

        def table(self, context, sizes):
            return {"sizes": list(sizes), "ms": [20.0 + 0.5 * s for s in sizes]}

    rec = S.step_record()
    rec.info.update({"rates": [40.0, 60.0, 70.0, 65.0], "chosen_T": 3, "expected_accept": 1.6})
    curve = cost_curve_from_step(rec, Curve())
    assert curve["sizes"] == [1, 2, 3, 4] and curve["chosen_T"] == 3
    fig = cost_figure(curve)
    assert list(trace(fig, "tps").y) == [40.0, 60.0, 70.0, 65.0]
    assert list(trace(fig, "chosen").y) == [70.0]


def test_automaton_figure_narrow_widths():
    # Narrow (phone) widths leave some nodes unlabelled; failure links must still draw.
    from visuals import automaton_figure
    from visuals.samples import automaton_snapshot
    snap = automaton_snapshot()
    for width in (240, 300, 334, 390):
        fig = automaton_figure(snap, width=width)
        assert any((t.meta or {}).get("role") == "fail_links" for t in fig.data)
