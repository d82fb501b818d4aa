"""The anatomy of a step, "what if" and "why missed" (racer.anatomy) against brute force, on a
tiny random model whose repetitive prompt gives the automaton borders to find."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from racer import anatomy as A
from racer import DecodeConfig, DecodeRun, make_drafter
from racer.drafters.pld import RUN_CANDIDATES, match_run
from racer.replay import Replay, Turn
from racer.sizing import Sizer
from racer.tiny import tiny_lm
from tests.test_replay import CURVE, PROMPT, V


def run_and_replay(lm, capacity="auto", automaton=10_000, **cfg):
    mk = lambda: make_drafter("racer", vocab_size=V, capacity_automaton=automaton)  # noqa: E731
    sizer = (lambda: Sizer(CURVE)) if capacity == "auto" else None
    run = DecodeRun(lm, PROMPT * 2, mk(), DecodeConfig(max_new_tokens=cfg.pop("max_new", 64), capacity=capacity,
                                                         **cfg), sizer=sizer() if sizer else None)
    steps = list(run)
    return steps, Replay([Turn(run.start, steps)], mk, sizer)


@pytest.fixture(scope="module")
def lm():
    return tiny_lm(vocab=V, seed=3, max_context=1024)


@pytest.fixture(scope="module")
def recorded(lm):
    return run_and_replay(lm)


def forwarded(steps):
    return [k for k, s in enumerate(steps) if s.forwarded]


def test_the_match_walk_lands_on_the_borders(recorded):
    steps, replay = recorded
    seen_border = False
    for k in forwarded(steps):
        state = replay.before(k)
        d = state.drafter
        m = A.match_stage(d, steps[k].root)
        ctx = state.context
        seq = ctx + [steps[k].root]
        walk = m["walk"]
        assert walk[0]["move"] == "state" and walk[0]["tokens"] == ctx[len(ctx) - walk[0]["depth"]:]
        assert all(w["move"] == "fail" for w in walk[1:-1])
        for w in walk:   # every node on the walk spells an ending of the text (+ x0 after the goto)
            end = seq if w["move"] == "goto" else ctx
            assert w["tokens"] == end[len(end) - w["depth"]:] if w["depth"] else True
        # brute force: the borders are the stored endings of text + x0 of length >= 2
        brute = [n for n in range(min(len(seq), d.automaton.window), 1, -1) if d.automaton.find(seq[-n:]) >= 0]
        assert [b["depth"] for b in m["borders"]] == brute
        assert [b["node"] for b in m["borders"]] == m["arrival_chain"]
        if brute:
            seen_border = True
            assert m["arrival"]["depth"] == brute[0] and walk[-1]["move"] == "goto"
    assert seen_border, "the repetitive prompt should give the automaton borders"


def test_stages_agree_with_the_recorded_step(recorded):
    steps, replay = recorded
    seen_chain = False
    for k in forwarded(steps):
        rec = steps[k]
        a = A.anatomy(replay.before(k))
        # 4: the pool's kept nodes are exactly the verified tree
        pool, kept = a["merge"]["pool"], a["merge"]["kept"]
        assert sum(1 for x in kept if x >= 0) == len(rec.tree) == a["merge"]["chosen_T"]
        for i, j in enumerate(kept):
            if j >= 0:
                assert rec.tree.tokens[j] == pool["tokens"][i]
        for c in a["retrieval"]["candidates"]:
            assert c["kept"] == (c["node"] >= 0 and kept[c["node"]] >= 0)
        # the buckets sizing judged it by: the recorded tree says which
        assert (a["merge"]["burst"], a["merge"]["conf"]) == (rec.tree.info["burst"], rec.tree.info["conf"])
        # the chain copies what followed the occurrence its run names, and the run is that
        # occurrence's: no earlier occurrence of the n-gram among the latest few agrees further
        ch = a["merge"]["chain"]
        if ch["tokens"]:
            ctx = replay.before(k).context
            ends = [e for e in range(len(ctx)) if match_run(ctx, e, rec.root) >= ch["match"]]
            runs = {e: match_run(ctx, e, rec.root) for e in ends}
            if ch["by_run"]:
                assert ch["run"] == max(runs[e] for e in ends[-RUN_CANDIDATES:])
            else:
                assert ch["run"] == runs[ends[-1]]
            picked = [e for e in ends[-RUN_CANDIDATES:] if runs[e] == ch["run"]][-1]
            assert ch["tokens"][:len(ctx) - picked - 1] == ctx[picked + 1:picked + 1 + len(ch["tokens"])]
            seen_chain = True
        # 3: no node grows more children than its breadth; x0's row is read first
        lg = a["logits"]
        for i, n in enumerate(lg["nodes"]):
            assert sum(1 for m in lg["nodes"] if m["parent"] == i) <= n["breadth"]
        assert sum(1 for m in lg["nodes"] if m["parent"] < 0) <= 8
        if lg["rows"]:
            assert lg["rows"][0]["token"] == rec.root
        # 5: the mask is the tree's attention mask (0 = attend)
        at = a["attention"]
        mask = rec.tree.attention_mask(at["past"], torch.float32, "cpu")[0, 0, :, at["past"]:]
        assert np.array_equal(np.array(at["ancestors"]) == 1, (mask == 0).numpy())
        assert at["positions"] == [at["past"] + d for d in rec.tree.depths]
        # 6: along the accepted path the model's top token is the next node's (greedy)
        v = a["verify"]
        path = v["accepted"]
        for x, y in zip(path, path[1:]):
            assert v["model_top"][x] == rec.tree.tokens[y]
        assert v["committed"] == rec.committed
        if v["reason"] == "mismatch":
            assert v["wanted"] == rec.next_root and v["wanted"] not in v["children"] and v["children"]
        # 7: every committed token's window is in the automaton afterwards
        u = a["update"]
        assert len(u["windows"]) == len(rec.committed)
    assert seen_chain, "the repetitive prompt should give the prompt-lookup chain matches"


def test_a_small_automaton_evicts_and_says_what(lm):
    steps, replay = run_and_replay(lm, automaton=24)
    evicted = 0
    for k in forwarded(steps):
        u = A.anatomy(replay.before(k))["update"]
        assert u["size_after"] <= 24
        evicted += len(u["evicted"])
        assert u["evicted"] == steps[k].info["evicted"]      # what the run itself reported
    assert evicted > 0


def test_what_if_the_run_itself_gives_the_run(recorded):
    steps, replay = recorded
    for k in forwarded(steps):
        state = replay.before(k)
        w = A.what_if(state, steps, A.variant_of_run(state))
        assert w["committed"] == len(steps[k].committed)
        assert w["tree"]["tokens"] == steps[k].tree.tokens


def test_what_if_variants_draft_what_they_say(recorded):
    steps, replay = recorded
    for k in forwarded(steps)[:12]:
        state = replay.before(k)
        seq, _ = A.continuation(steps, k)
        for v in (A.Variant(retrieval=False), A.Variant(logits=False), A.Variant(lookup=False),
                  A.Variant(capacity=8), A.Variant(capacity=64, breadth_rule="released"),
                  A.Variant(retrieval=False, logits=False, lookup=False)):
            w = A.what_if(state, steps, v)
            srcs = set(w["tree"]["sources"][1:])
            if not v.retrieval:
                assert "retrieval" not in srcs and "both" not in srcs
            if not v.logits:
                assert "logits" not in srcs and "both" not in srcs
            if not v.lookup:
                assert "lookup" not in srcs
            if v.capacity != "auto":
                assert w["nodes"] <= v.capacity
            # the accepted length is the longest root path that spells the real continuation
            toks, par = w["tree"]["tokens"], w["tree"]["parents"]
            path = w["path"]
            assert [toks[i] for i in path] == seq[:len(path)] and w["committed"] == len(path)
            nxt = seq[len(path)] if len(path) < len(seq) else None
            assert not any(par[i] == path[-1] and toks[i] == nxt for i in range(1, len(toks)))
        # the drafter's switches are back: the run's own draft again
        assert A.what_if(state, steps, A.variant_of_run(state))["committed"] == len(steps[k].committed)


def test_why_missed_points_at_real_places(recorded):
    steps, replay = recorded
    found = 0
    for k in forwarded(steps):
        rec = steps[k]
        state = replay.before(k)
        y = A.why_missed(state, steps)
        if rec.next_root is None:
            assert y is None
            continue
        target = list(rec.committed[1:]) + [rec.next_root]
        if "capacity_needed" in y:
            t = state.drafter.draft(state.context, rec.root, y["capacity_needed"]).tree
            node = 0
            for tok in target:
                node = t.child(node, tok)
                assert node >= 0
        if "logits" in y:
            assert state.drafter.store.row(rec.committed[-1])[y["logits"]["rank"]] == rec.next_root
        if "pool" in y and "order" in y["pool"]:
            assert y["pool"]["order"] >= y["pool"]["chosen_T"]     # it ranked below the cut
        found += y["found"]
    assert found > 0


def test_what_if_under_sampling_gives_no_length(lm):
    steps, replay = run_and_replay(lm, temperature=0.8, seed=2)
    k = forwarded(steps)[0]
    w = A.what_if(replay.before(k), steps, A.Variant(capacity=8), greedy=False)
    assert w["committed"] is None and w["note"] == "sampling"
