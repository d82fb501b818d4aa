"""Trace files: a recorded run exported and loaded back replays identically without the model;
damaged files are refused with a reason; the shipped example traces (real SmolLM2 runs) load
and replay exactly."""
from __future__ import annotations

import gzip
import json

import pytest

from racer import anatomy as A
from racer import loop
from racer import DecodeConfig, DecodeRun, make_drafter
from racer.records import run_numbers
from racer.replay import ReplayError, Turn
from racer.sizing import Sizer
from racer.tiny import TinyTokenizer, tiny_lm
from racer_app import tracefile
from racer_app.session import Trace
from tests.test_replay import CURVE, PROMPT, V

#: The chain of racer drafters before trace version 6.
OLD_CHAIN = {"chain_pick": "recent", "long_chain": 0}


def recorded(lm, drafter, sizer: Sizer, title: str, max_new_tokens: int, detail: bool = False,
             settings: dict | None = None, **drafter_info) -> Trace:
    """A tiny run of PROMPT by `drafter` as a race trace (every step in detail with `detail`)."""
    run = DecodeRun(lm, PROMPT, drafter, DecodeConfig(max_new_tokens=max_new_tokens, detail=detail), sizer=sizer)
    steps = list(run)
    tok = TinyTokenizer(V)
    return Trace(steps, list(PROMPT), lambda t: tok.decode([t]), lambda ids: tok.decode(list(ids)),
                 source="race", title=title, model="tiny", settings=settings or {},
                 detail_steps=len(steps) if detail else 0, stop_reason=run.result.stop_reason, cost_curve=CURVE,
                 turns=[Turn(run.start, steps)], drafter={"method": "racer", "options": {}, "vocab_size": V,
                                                          **drafter_info}, sizer=dict(sizer.settings))


@pytest.fixture(scope="module")
def trace():
    return recorded(tiny_lm(vocab=V, seed=3, max_context=1024), make_drafter("racer", vocab_size=V), Sizer(CURVE),
                    "tiny run", 40, detail=True, settings={"temperature": 0.0})


def recorded_as_file(lm, drafter, sizer: Sizer, path, **drafter_info) -> dict:
    """A tiny run of PROMPT (60 new tokens) saved as a trace file, read back as a dict to edit."""
    trace = recorded(lm, drafter, sizer, path.stem, 60, **drafter_info)
    return json.loads(tracefile.save(trace, path).read_text())


def anatomies(tr: Trace) -> list:
    rep = tr.replay()
    return [A.anatomy(rep.before(k)) for k in range(tr.n)]


@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_export_and_load_back_replays_identically(trace, tmp_path, suffix):
    path = tracefile.save(trace, tmp_path / f"t{suffix}")
    back = tracefile.load(path)
    assert back.origin == "file" and back.n == trace.n and back.title == "tiny run"
    assert [s.committed for s in back.steps] == [s.committed for s in trace.steps]
    assert back.spans() == trace.spans()
    assert run_numbers(back.steps) == run_numbers(trace.steps)
    # every token the pictures show reads the same without the tokenizer
    for t in tracefile.token_ids(trace):
        assert back.decode_one(t) == trace.decode_one(t)
    assert json.dumps(anatomies(back), default=str) == json.dumps(anatomies(trace), default=str)


def test_damaged_files_are_refused_with_a_reason(trace, tmp_path):
    good = tracefile.trace_to_dict(trace)
    cases = {
        b"not json at all": "not JSON",
        json.dumps({"hello": 1}).encode(): "not a RACER Studio trace",
        json.dumps(dict(good, version=99)).encode(): "version 99",
        json.dumps(dict(good, steps=[])).encode(): "no steps",
        json.dumps(dict(good, steps=[{"index": 0}])).encode(): "damaged",
        gzip.compress(b"{")[:-4]: "gzip",
        # a hostile file must not make the replay allocate a huge table or draft without end
        json.dumps(dict(good, drafter={"method": "racer", "options": {}, "vocab_size": 10**10})).encode():
            "vocabulary size",
        json.dumps(dict(good, drafter={"method": "racer", "options": {"topk": 10**6}, "vocab_size": 96})).encode():
            "topk",
        json.dumps(dict(good, drafter={"method": "rm -rf", "options": {}, "vocab_size": 96})).encode(): "no drafter",
        json.dumps(dict(good, sizer={"pool_factor": 10**6})).encode(): "sizer",
        json.dumps(dict(good, steps=[dict(good["steps"][0], capacity=10**9)])).encode(): "more than 4096 nodes",
    }
    for raw, why in cases.items():
        with pytest.raises(tracefile.TraceFileError, match=why):
            tracefile.load(raw)
    with pytest.raises(tracefile.TraceFileError, match="larger than"):
        tracefile.load(json.dumps(good).encode(), max_bytes=1024)


def test_a_trace_without_replay_data_still_loads(trace):
    d = tracefile.trace_to_dict(trace)
    d["turns"] = []
    back = tracefile.trace_from_dict(json.loads(json.dumps(d)))
    assert back.replay() is None and back.n == trace.n


def test_the_shipped_traces_replay_exactly():
    shipped = tracefile.shipped_index()
    assert len(shipped) >= 3, "assets/traces/index.json lists the shipped traces (scripts/make_traces.py)"
    for row in shipped:
        tr = tracefile.load(row["path"])
        n = run_numbers(tr.steps)
        assert (n.tokens, n.forwards) == (row["tokens"], row["forwards"])
        rep = tr.replay()
        assert rep is not None
        evicted = 0
        for k, s in enumerate(tr.steps):
            state = rep.before(k)        # raises ReplayError where the recording is not reproduced
            if s.forwarded:
                assert A.what_if(state, tr.steps, A.variant_of_run(state))["committed"] == len(s.committed)
                evicted += len(s.info.get("evicted") or [])
        if "48 nodes" in row["title"]:
            assert evicted > 0, "the small-automaton example shows evictions"


def test_a_version_1_trace_replays_with_the_sizer_it_was_recorded_with(tmp_path, monkeypatch):
    # Version 1 sizers learnt from disturbed forwards too. Every third forward is timed at 33 ms
    # (3x the curve), the others at 11: recorded that way, the run replays only if the file's
    # sizer learns from those forwards again. The times are scripted, not slept: with real sleeps
    # a busy CI machine's own timings once left the two sizers choosing the same trees.
    lm = tiny_lm(vocab=V, seed=3, max_context=1024)
    calls = [0]

    class ScriptedClock(loop._ForwardClock):
        def ms(self) -> float:
            calls[0] += 1
            return 33.0 if calls[0] % 3 == 0 else 11.0
    monkeypatch.setattr(loop, "_ForwardClock", ScriptedClock)
    sizer = Sizer(CURVE, skip_disturbed=False, calibrate=True, match_run=False, confidence=False)
    d = recorded_as_file(lm, make_drafter("racer", vocab_size=V, **OLD_CHAIN), sizer, tmp_path / "v3.json")
    assert d["version"] == tracefile.VERSION == 6
    d["version"] = 1
    del d["sizer"]["skip_disturbed"], d["sizer"]["calibrate"], d["sizer"]["match_run"], d["sizer"]["confidence"]
    (tmp_path / "v1.json").write_text(json.dumps(d))
    back = tracefile.load(tmp_path / "v1.json")
    assert back.sizer["skip_disturbed"] is False and back.sizer["calibrate"] is True
    assert back.sizer["match_run"] is False and back.sizer["confidence"] is False
    rep = back.replay()
    for k in range(back.n):
        rep.before(k)                    # ReplayError if the sizer chose other trees
    # Read as version 2 (the current defaults) it does not replay: the settings matter.
    d["version"] = 2
    (tmp_path / "v2b.json").write_text(json.dumps(d))
    rep = tracefile.load(tmp_path / "v2b.json").replay()
    with pytest.raises(ReplayError):
        for k in range(back.n):
            rep.before(k)


def test_a_version_4_trace_replays_without_the_cold_row_agreement_it_did_not_have(tmp_path, own_cache):
    # Version 4 racer drafters did not mark copy-logit entries the root's cold row agrees with; read
    # as such, the file's drafter must not either, or its sizer would choose other trees.
    from racer.coldrows import get_cold_rows
    lm = tiny_lm(vocab=V, seed=3, max_context=1024)
    rows = get_cold_rows(lm)
    d = recorded_as_file(lm, make_drafter("racer", vocab_size=V, cold_agree=False, **OLD_CHAIN), Sizer(CURVE),
                         tmp_path / "v5.json", cold_rows=rows.key)
    assert d["turns"][0]["start"]["cold_rows"]
    d["version"] = 4
    (tmp_path / "v4.json").write_text(json.dumps(d))
    back = tracefile.load(tmp_path / "v4.json")
    assert back.drafter["options"] == {"cold_agree": False, **OLD_CHAIN} and back.sizer["first_pass"] == 0
    rep = back.replay()
    for k in range(back.n):
        rep.before(k)                    # ReplayError if the drafter drafted other trees
    # Read as version 5 (agreement marked) it does not replay.
    d["version"] = 5
    (tmp_path / "v5.json").write_text(json.dumps(d))
    rep = tracefile.load(tmp_path / "v5.json").replay()
    with pytest.raises(ReplayError):
        for k in range(back.n):
            rep.before(k)
    # A version 5 file may carry the setting itself.
    d["version"], d["drafter"]["options"] = 5, {"cold_agree": False}
    (tmp_path / "v5b.json").write_text(json.dumps(d))
    assert tracefile.load(tmp_path / "v5b.json").drafter["options"] == {"cold_agree": False, **OLD_CHAIN}


def test_a_version_5_trace_replays_with_the_chain_it_was_recorded_with(tmp_path):
    # Version 5 racer drafters' chains copied the latest occurrence and stopped at 16 tokens. PROMPT
    # repeats "5 6 7 8" with three continuations, so the two rules copy different occurrences.
    lm = tiny_lm(vocab=V, seed=3, max_context=1024)
    d = recorded_as_file(lm, make_drafter("racer", vocab_size=V, **OLD_CHAIN), Sizer(CURVE), tmp_path / "v6.json")
    d["version"] = 5
    (tmp_path / "v5.json").write_text(json.dumps(d))
    back = tracefile.load(tmp_path / "v5.json")
    assert back.drafter["options"] == OLD_CHAIN
    rep = back.replay()
    for k in range(back.n):
        rep.before(k)                    # ReplayError if the drafter drafted other trees
    # Read as version 6 (the current chain) it does not replay.
    rep = tracefile.load(tmp_path / "v6.json").replay()
    with pytest.raises(ReplayError):
        for k in range(back.n):
            rep.before(k)
    # A file may name the chain settings itself; they are checked like any other.
    d["version"], d["drafter"]["options"] = 6, {"chain_pick": "latest"}
    (tmp_path / "bad.json").write_text(json.dumps(d))
    with pytest.raises(tracefile.TraceFileError, match="chain_pick"):
        tracefile.load(tmp_path / "bad.json")
