"""Replaying a recorded run (racer.replay) rebuilds the drafter's and the sizer's state exactly:
every replayed step drafts and sizes the recorded tree, for one run, for a chat's turns, under
sampling, and after a JSON round trip; a replay with other settings is caught."""
from __future__ import annotations

import json

import numpy as np
import pytest

from racer import DecodeConfig, DecodeRun, make_drafter
from racer.costcurve import CostCurve
from racer.records import StartRecord, StepRecord, run_numbers
from racer.replay import Replay, ReplayError, Turn
from racer.sizing import Sizer, prune
from racer.tiny import tiny_lm

V = 96
#: A made-up cost curve (ms per forward by tree size and context): sizing without measuring.
CURVE = CostCurve([1, 2, 4, 8, 16, 32, 64], [64, 512], [[10, 10.5, 11, 12.5, 15, 22, 40],
                                                        [12, 12.6, 13.5, 15, 18, 27, 50]], {}, "")
PROMPT = [5, 6, 7, 8, 9, 10, 5, 6, 7, 8, 11, 12, 5, 6, 7, 8, 9, 10, 13, 14, 5, 6, 7]


@pytest.fixture(scope="module")
def lm():
    return tiny_lm(vocab=V, seed=3, max_context=1024)


def racer(**kw):
    return make_drafter("racer", vocab_size=V, **kw)


def record(lm, prompt=PROMPT, capacity="auto", sizer=None, drafter=None, new_from=0, **cfg):
    sizer = sizer if sizer is not None else (Sizer(CURVE) if capacity == "auto" else None)
    d = drafter if drafter is not None else racer()
    run = DecodeRun(lm, prompt, d, DecodeConfig(max_new_tokens=cfg.pop("max_new", 48), capacity=capacity, **cfg),
                    sizer=sizer, new_from=new_from)
    steps = list(run)
    return run, steps


def replay_all(replay: Replay) -> None:
    """Replay every step of the last turn (raises ReplayError at the first mismatch)."""
    state = replay.before(len(replay.steps) - 1)
    assert state.k == len(replay.steps) - 1


@pytest.mark.parametrize("capacity", ["auto", 12])
def test_every_step_replays_to_the_recorded_tree(lm, capacity):
    run, steps = record(lm, capacity=capacity)
    assert run.start is not None and run.start.context == PROMPT
    assert all(s.topk is not None and s.capacity >= 1 for s in steps if s.forwarded)
    sizer = (lambda: Sizer(CURVE)) if capacity == "auto" else None
    replay = Replay([Turn(run.start, steps)], racer, sizer)
    for k in range(len(steps)):
        state = replay.before(k)
        assert state.context == PROMPT + [t for s in steps[:k] for t in s.committed]
        if steps[k].forwarded:
            pool = state.propose()
            tree = prune(pool, state.sizer.plan(pool, len(state.context)).keep) if state.sizer else pool
            assert tree.tokens == steps[k].tree.tokens and tree.parents == steps[k].tree.parents


def test_a_replay_with_other_settings_is_caught(lm):
    # A fixed capacity, so the trees do not depend on how long this machine's steps took (a sizer
    # that keeps only a few nodes can make trees that rows of 4 and of 8 entries would both give).
    run, steps = record(lm, capacity=12)
    turns = [Turn(run.start, steps)]
    replay_all(Replay(turns, racer))
    # Without the prompt-lookup chain the drafter cannot propose the run's lookup nodes.
    assert any("lookup" in s.tree.sources for s in steps)
    with pytest.raises(ReplayError, match="step"):
        replay_all(Replay(turns, lambda: racer(lookup_chain=False)))
    # A sized run replayed without its sizer: the drafter's whole pool against the kept tree.
    run, steps = record(lm)
    with pytest.raises(ReplayError):
        replay_all(Replay([Turn(run.start, steps)], racer, None))


def test_a_chat_replays_its_turns_in_order(lm):
    drafter, sizer = racer(), Sizer(CURVE)
    run1, steps1 = record(lm, drafter=drafter, sizer=sizer, max_new=24)
    context = PROMPT + run1.result.token_ids + [3, 4] + PROMPT[:6]
    run2, steps2 = record(lm, prompt=context, drafter=drafter, sizer=sizer,
                          new_from=len(PROMPT) + run1.result.new_tokens, max_new=24)
    assert run2.start.new_from == len(PROMPT) + run1.result.new_tokens
    replay_all(Replay([Turn(run1.start, steps1), Turn(run2.start, steps2)], racer, lambda: Sizer(CURVE)))
    # The second turn alone does not replay: its drafter had learnt from the first.
    with pytest.raises(ReplayError):
        replay_all(Replay([Turn(run2.start, steps2)], racer, lambda: Sizer(CURVE)))


def test_sampling_runs_replay_too(lm):
    run, steps = record(lm, temperature=0.9, top_p=0.95, seed=4)
    replay_all(Replay([Turn(run.start, steps)], racer, lambda: Sizer(CURVE)))


def test_records_survive_a_json_round_trip(lm):
    run, steps = record(lm)
    steps2 = [StepRecord.from_dict(json.loads(json.dumps(s.to_dict()))) for s in steps]
    start2 = StartRecord.from_dict(json.loads(json.dumps(run.start.to_dict())))
    for a, b in zip(steps, steps2):
        if a.topk_p is not None:
            assert np.array_equal(np.asarray(a.topk_p, dtype=np.float32), b.topk_p)   # bit for bit
    t1, p1 = run.start.full_topk()
    t2, p2 = start2.full_topk()
    assert np.array_equal(t1, t2) and np.array_equal(p1, p2)
    replay_all(Replay([Turn(start2, steps2)], racer, lambda: Sizer(CURVE)))


def test_sizer_plan_changes_nothing_and_size_keeps_the_plan(lm):
    run, steps = record(lm)
    state = Replay([Turn(run.start, steps)], racer, lambda: Sizer(CURVE)).before(min(5, len(steps) - 1))
    pool = state.propose()
    before = (state.sizer._idle, json.dumps(state.sizer.model.counts, sort_keys=True, default=str))
    plan = state.sizer.plan(pool, len(state.context))
    assert (state.sizer._idle, json.dumps(state.sizer.model.counts, sort_keys=True, default=str)) == before
    sized = state.sizer.size(pool, len(state.context))
    assert len(sized) == len(plan.keep) == sized.info["chosen_T"]
    # E(T) at the chosen size is the expected tokens the step record states
    assert sized.info["expected_by_size"][len(sized) - 1] == pytest.approx(sized.info["expected_accept"], abs=1e-3)


def test_run_numbers_count_like_the_decode_result(lm):
    run, steps = record(lm)
    n = run_numbers(steps)
    assert (n.tokens, n.steps, n.forwards) == (run.result.new_tokens, run.result.steps, run.result.forwards)
    assert n.mat == run.result.mat
