"""One definition each of step, MAT and expected tokens: the inspector's header and sentence, the
figures, the race's stats and the benchmark's result all read them from the same fields
(racer.records.run_numbers, the step record's info), so a newcomer never sees two numbers for
one thing."""
from __future__ import annotations

import re

import pytest

from racer import DecodeConfig, DecodeRun, make_drafter
from racer.race import Race
from racer.records import run_numbers
from racer.replay import Turn
from racer.sizing import Sizer
from racer.tiny import TinyTokenizer, tiny_lm
from racer_app.format import lane_stats_md, numbers_md, step_sentence, trace_header_md
from racer_app.inspector import step_cost_data
from racer_app.session import Trace
from tests.test_replay import CURVE, PROMPT, V
from visuals import acceptance_by_source, cost_figure


@pytest.fixture(scope="module")
def run():
    lm = tiny_lm(vocab=V, seed=3, max_context=1024)
    r = DecodeRun(lm, PROMPT * 2, make_drafter("racer", vocab_size=V), DecodeConfig(max_new_tokens=48),
                  sizer=Sizer(CURVE))
    steps = list(r)
    tok = TinyTokenizer(V)
    trace = Trace(steps, PROMPT * 2, lambda t: tok.decode([t]), lambda ids: tok.decode(list(ids)), title="t",
                  cost_curve=CURVE, turns=[Turn(r.start, steps)], detail_steps=len(steps),
                  drafter={"method": "racer", "options": {}, "vocab_size": V}, sizer={})
    return lm, r, steps, trace


def test_counts_agree_everywhere(run):
    lm, r, steps, trace = run
    n = run_numbers(steps)
    res = r.result
    assert (n.tokens, n.steps, n.forwards, n.mat) == (res.new_tokens, res.steps, res.forwards, res.mat)
    assert res.to_dict()["mat"] == round(n.mat, 4)                    # what the benchmark stores
    header = trace_header_md(trace)
    assert numbers_md(n) in header and f"MAT **{n.mat:.2f}**" in header
    # the figure counts the same records, numbered as the slider numbers them (1..n)
    fig = acceptance_by_source(steps)
    # (legend-only traces, for a source drafted but never accepted, carry no data)
    xs = sorted({x for t in fig.data if (t.meta or {}).get("role") == "source" for x in t.x})
    assert xs == [s.index + 1 for s in steps] == list(range(1, trace.n + 1))
    sub = fig.layout.title.subtitle.text
    assert f"{n.tokens} tokens in {n.forwards} forward passes" in sub and f"{n.steps} steps" in sub
    for k, s in enumerate(steps):
        assert step_sentence(s, trace.decode_many, trace.n).startswith(f"**Step {k + 1} of {trace.n}.**")


def test_the_race_counts_the_same_way(run):
    lm, r, steps, trace = run
    race = Race(lm, PROMPT * 2, {"racer": make_drafter("racer", vocab_size=V)}, DecodeConfig(max_new_tokens=48),
                run_kwargs={"racer": {"sizer": Sizer(CURVE)}}, cost_curve=CURVE)
    recs = [rec for _, rec in race]
    lane = race.lanes["racer"]
    n = run_numbers(recs)
    assert (lane.n_tokens, lane.steps, lane.forwards, lane.mat) == (n.tokens, n.steps, n.forwards, n.mat)
    md = lane_stats_md(lane, running=False)
    assert f"**{n.tokens}** tokens · **{n.forwards}** forwards · MAT **{n.mat:.2f}**" in md


def test_expected_tokens_are_one_number(run):
    lm, r, steps, trace = run
    checked = 0
    for s in steps:
        info = s.info
        if info.get("chosen_T") is None:
            continue
        e = info["expected_accept"]
        sentence = step_sentence(s, trace.decode_many, trace.n)
        assert f"expecting {e:.2f} tokens" in sentence
        data = step_cost_data(trace, s)
        T = data["chosen_T"]
        assert T == len(s.tree)
        at = data["sizes"].index(T)
        assert f"{data['expected_tokens'][at]:.2f}" == f"{e:.2f}"         # the figure's E at the chosen T
        assert data["ms"][at] == info["cost_ms"][T - 1]                    # the forward time sizing assumed
        fig = cost_figure(data)
        tps = next(t for t in fig.data if (t.meta or {}).get("role") == "tps")
        assert list(tps.y) == [info["rates"][t - 1] * 1e3 for t in data["sizes"]]
        checked += 1
    assert checked > 0
    # the header's MAT is never the sentence's E: they are different things, named apart
    assert re.search(r"MAT \*\*[\d.]+\*\*", trace_header_md(trace))
