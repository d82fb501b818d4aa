"""The race's clock (racer.race): each lane charged the wall time of its own steps, its prefill
kept apart; a forward far above what the cost curve predicts is counted as disturbed and charged
its quiet estimate (the curve x the method's quiet level, learnt from undisturbed forwards of
quiet races); the whole-request figure charges every lane the shortest prefill. Disturbance is
planted (a forward that sleeps), so the checks do not depend on how busy the test machine is."""
from __future__ import annotations

import random
import time

import pytest

from racer import DecodeConfig, make_drafter
from racer.costcurve import CostCurve
from racer.race import LEARN_SHARE, PREFILL, PREFILL_SPREAD, SLOWED, QuietLevels, Race, quiet_levels
from racer.sizing import DISTURBED
from racer.tiny import tiny_lm

V = 96
SLEEP_S = 0.25


@pytest.fixture(scope="module")
def lm():
    return tiny_lm(vocab=V)


def prompt() -> list[int]:
    rng = random.Random(0)
    chunk = [rng.randrange(V) for _ in range(6)]
    return (chunk + [rng.randrange(V) for _ in range(3)]) * 3


def generous_curve() -> CostCurve:
    """A curve that expects 100 ms per forward: no real tiny forward comes near DISTURBED x that."""
    sizes = [1, 2, 4, 8, 16, 32, 64]
    return CostCurve(sizes, [64, 512], [[100.0] * len(sizes)] * 2, {"test": "generous"})


def sleepy(lm, every: int):
    """Make every `every`-th forward of lm.model sleep SLEEP_S first (a busy machine, planted)."""
    real, calls = lm.model.forward, [0]

    def forward(*a, **kw):
        calls[0] += 1
        if calls[0] % every == 0:
            time.sleep(SLEEP_S)
        return real(*a, **kw)
    lm.model.forward = forward
    return lambda: setattr(lm.model, "forward", real)


def run(race: Race) -> Race:
    for _ in race:
        pass
    return race


def test_a_quiet_race_charges_wall_time_and_keeps_the_prefill_apart(lm):
    race = run(Race(lm, prompt(), {m: make_drafter(m, vocab_size=V) for m in ("racer", "ar")},
                    DecodeConfig(max_new_tokens=24, capacity=8), cost_curve=generous_curve()))
    for lane in race.lanes.values():
        assert lane.disturbed_steps == 0 and lane.checked_forwards == lane.forwards - 1
        assert lane.compute_s > 0 and lane.prefill_s > 0 and lane.points[0] == (0.0, 0)
        assert lane.total_tokens_per_s(race.shared_prefill_s) < lane.tokens_per_s
    assert min(ln.prefill_s for ln in race.lanes.values()) <= race.shared_prefill_s \
        <= max(ln.prefill_s for ln in race.lanes.values())


def tight_curve(ms: float = 2.0) -> CostCurve:
    """A curve that expects `ms` per forward: a planted sleep is far above it, a tiny real forward is not."""
    sizes = [1, 2, 4, 8, 16, 32, 64]
    return CostCurve(sizes, [64, 512], [[ms] * len(sizes)] * 2, {"test": "tight"})


def test_disturbed_forwards_are_counted_and_charged_their_quiet_estimate(lm):
    curve = tight_curve()
    restore = sleepy(lm, every=4)
    try:
        race = run(Race(lm, prompt(), {"ar": make_drafter("ar")}, DecodeConfig(max_new_tokens=24), cost_curve=curve))
    finally:
        restore()
    ar = race.lanes["ar"]
    slept = ar.forwards // 4
    assert ar.checked_forwards == ar.forwards - 1     # every forward but the prefill's
    assert slept - 1 <= ar.disturbed_steps <= ar.checked_forwards
    # The wall clock keeps the sleeps; the charged clock does not: each disturbed step is charged
    # its wall time scaled by (quiet level x the curve's ms) / its measured forward.
    assert ar.wall_compute_s >= (slept - 1) * SLEEP_S
    assert ar.compute_s < SLEEP_S
    quiet = [f / e for _, _, f, e in ar.charges if e and f <= DISTURBED * e]
    level = race.level("ar")
    assert level == pytest.approx(sorted(quiet)[len(quiet) // 2] if len(quiet) % 2 else
                                  sum(sorted(quiet)[len(quiet) // 2 - 1:len(quiet) // 2 + 1]) / 2)
    assert ar.estimated_steps == ar.disturbed_steps
    for charged, dt, f, e in ar.charges:
        want = dt * min(1.0, level * e / f) if e and f > DISTURBED * e else dt
        assert charged == pytest.approx(want)
    assert sum(c for c, _, _, _ in ar.charges) == pytest.approx(ar.compute_s, abs=0.01)
    assert sum(dt for _, dt, _, _ in ar.charges) == pytest.approx(ar.wall_compute_s, abs=0.01)
    # A busy race teaches the curve's quiet levels nothing.
    assert race.disturbed_steps >= LEARN_SHARE * sum(ln.checked_forwards for ln in race.lanes.values())
    assert quiet_levels(curve).level("ar") is None


def test_a_race_busy_from_its_first_forward_is_charged_by_earlier_quiet_races(lm):
    curve = tight_curve()
    quiet = run(Race(lm, prompt(), {m: make_drafter(m, vocab_size=V) for m in ("racer", "ar")},
                     DecodeConfig(max_new_tokens=24, capacity=8), cost_curve=curve))
    assert quiet.disturbed_steps < LEARN_SHARE * sum(ln.checked_forwards for ln in quiet.lanes.values())
    levels = quiet_levels(curve)
    learnt = {"ar": levels.level("ar")}
    assert learnt["ar"] is not None and learnt["ar"] == pytest.approx(quiet.level("ar"))
    restore = sleepy(lm, every=1)      # every forward sleeps: nothing undisturbed to learn from
    try:
        busy = run(Race(lm, prompt(), {"ar": make_drafter("ar")}, DecodeConfig(max_new_tokens=8), cost_curve=curve))
    finally:
        restore()
    ar = busy.lanes["ar"]
    assert ar.disturbed_steps == ar.estimated_steps == ar.checked_forwards > 0
    assert busy.level("ar") == learnt["ar"] and ar.compute_s < SLEEP_S <= ar.wall_compute_s / ar.checked_forwards
    assert levels.level("ar") == learnt["ar"]          # unchanged by the busy race


def test_a_forward_slowed_under_the_curves_line_is_disturbed_once_quiet_races_taught_a_level(lm):
    # A host running every forward 20-40 % slow stays under DISTURBED x the curve; against what
    # quiet races measured it is over SLOWED x. Planted with the levels: quiet races that "ran"
    # at 1/10,000 of the generous curve put every real tiny forward far above its quiet estimate,
    # and none comes near DISTURBED x the curve's 100 ms.
    curve = generous_curve()
    levels = QuietLevels()
    levels.learn({"ar": [1e-4] * QuietLevels.MIN})      # plain decoding's alone: RACER's lane uses it pooled
    race = run(Race(lm, prompt(), {m: make_drafter(m, vocab_size=V) for m in ("racer", "ar")},
                    DecodeConfig(max_new_tokens=16, capacity=8), cost_curve=curve, levels=levels))
    for lane in race.lanes.values():
        assert all(e and SLOWED * 1e-4 * e < f <= DISTURBED * e for _, _, f, e in lane.charges[:-1] if e)
        assert lane.disturbed_steps == lane.estimated_steps == lane.checked_forwards > 0
        for charged, dt, f, e in lane.charges:
            assert charged == pytest.approx(dt * 1e-4 * e / f if e else dt)
        assert sum(c for c, _, _, _ in lane.charges) < 0.2 * lane.wall_compute_s
    assert race.level("ar") == race.level("racer") == pytest.approx(1e-4)
    # A busy race teaches nothing: the levels stay those of the quiet races.
    assert levels.level("ar") == pytest.approx(1e-4) and levels.level("racer") is None
    # Quiet races that ran at the curve's own time: every tiny forward is far under both lines.
    slow = QuietLevels()
    slow.learn({m: [1.0] * QuietLevels.MIN for m in ("racer", "ar")})
    quiet = run(Race(lm, prompt(), {m: make_drafter(m, vocab_size=V) for m in ("racer", "ar")},
                     DecodeConfig(max_new_tokens=16, capacity=8), cost_curve=curve, levels=slow))
    assert all(ln.disturbed_steps == 0 and ln.compute_s == ln.wall_compute_s for ln in quiet.lanes.values())


@pytest.mark.parametrize("prefill_points", [False, True], ids=["tree-curve", "prefill-points"])
def test_a_disturbed_prefill_is_charged_what_quiet_races_measured_for_it(lm, prefill_points):
    curve = tight_curve()
    if prefill_points:      # a curve that timed prefills judges a prompt by them, not by the trees
        curve.prefill_tokens, curve.prefill_ms = [8, 32, 128], [3.0, 4.0, 9.0]
        assert curve.prefill(len(prompt())) == pytest.approx(3.0 + (len(prompt()) - 8) / 24)
    drafters = lambda: {m: make_drafter(m, vocab_size=V) for m in ("racer", "ar")}  # noqa: E731
    first = run(Race(lm, prompt(), drafters(), DecodeConfig(max_new_tokens=16, capacity=8), cost_curve=curve))
    assert all(ln.prefill_level is None and not ln.prefill_disturbed for ln in first.lanes.values())
    learnt = quiet_levels(curve).level(PREFILL + "ar")
    assert first.lanes["ar"].prefill_expected_ms == curve.prefill(len(prompt()))
    assert learnt == pytest.approx(first.lanes["ar"].prefill_s * 1e3 / curve.prefill(len(prompt())))
    real = lm.model.forward

    def slow_prefill(*a, **kw):        # only a prefill feeds the whole prompt at once
        if kw["input_ids"].shape[1] == len(prompt()):
            time.sleep(SLEEP_S)
        return real(*a, **kw)
    lm.model.forward = slow_prefill
    try:
        busy = run(Race(lm, prompt(), drafters(), DecodeConfig(max_new_tokens=16, capacity=8), cost_curve=curve))
    finally:
        lm.model.forward = real
    for ln in busy.lanes.values():
        assert ln.prefill_s > SLEEP_S and ln.prefill_disturbed
        assert ln.quiet_prefill_s == pytest.approx(ln.prefill_level * ln.prefill_expected_ms / 1e3)
        assert ln.quiet_prefill_s < SLEEP_S
    assert busy.lanes["ar"].prefill_level == learnt
    assert busy.shared_prefill_s < SLEEP_S
    ar = busy.lanes["ar"]
    assert ar.total_tokens_per_s(busy.shared_prefill_s) > ar.n_tokens / (ar.compute_s + SLEEP_S)
    from racer_app.format import disturbed_md, lane_stats_md
    assert "prefill too" in lane_stats_md(ar, running=False)
    assert "The prefills of RACER and Plain autoregressive took" in disturbed_md(busy.lanes)


def test_with_no_quiet_forward_known_a_disturbed_step_is_charged_its_wall_time(lm):
    from racer_app.format import disturbed_md
    restore = sleepy(lm, every=1)
    try:
        race = run(Race(lm, prompt(), {"ar": make_drafter("ar")}, DecodeConfig(max_new_tokens=6),
                        cost_curve=tight_curve()))
    finally:
        restore()
    ar = race.lanes["ar"]
    assert race.level("ar") is None and ar.estimated_steps == 0 < ar.disturbed_steps
    assert ar.compute_s == pytest.approx(ar.wall_compute_s) and ar.compute_s >= ar.checked_forwards * SLEEP_S
    assert "charged at wall time" in disturbed_md(race.lanes)


def test_quiet_levels_are_medians_of_the_last_quiet_races():
    levels = QuietLevels()
    assert levels.level("racer") is None and levels.level("racer", pooled=True) is None
    levels.learn({"racer": [1.2] * 20, "ar": [1.0] * 7})        # too few ar forwards for a median
    assert levels.level("racer") == 1.2 and levels.level("ar") is None
    assert levels.level("ar", pooled=True) == 1.2
    levels.learn({PREFILL + "ar": [3.0]})                       # a prefill's level: one a race, never pooled
    assert levels.level(PREFILL + "ar") == 3.0 and levels.level("ar", pooled=True) == 1.2
    later = [(1.1, 1.05), (1.0, 0.9), (0.9, 0.95), (1.05, 1.0), (0.95, 0.9)][:QuietLevels.RACES]
    for r, a in later:
        levels.learn({"racer": [r] * 10, "ar": [a] * 10})
    # Only the last QuietLevels.RACES races count: 1.2 has left the window (with it, racer would read 1.025).
    assert levels.level("racer") == pytest.approx(sorted(r for r, _ in later)[len(later) // 2])
    assert levels.level("ar") == pytest.approx(sorted(a for _, a in later)[len(later) // 2])


def test_a_disturbed_prefill_stays_out_of_the_decoding_clock(lm):
    drafters = {m: make_drafter(m, vocab_size=V) for m in ("racer", "ar", "tr")}
    real_start = drafters["ar"].start

    def slow_start(*a, **kw):       # inside ar's prefill: it alone is disturbed
        time.sleep(SLEEP_S)
        return real_start(*a, **kw)
    drafters["ar"].start = slow_start
    race = run(Race(lm, prompt(), drafters, DecodeConfig(max_new_tokens=16, capacity=8), cost_curve=generous_curve()))
    ar, others = race.lanes["ar"], [race.lanes["racer"], race.lanes["tr"]]
    assert ar.prefill_s > SLEEP_S and ar.compute_s < SLEEP_S
    # The one slowed prefill moves neither the shortest nor, beyond PREFILL_SPREAD x it, what a
    # whole-request figure charges its lane; a lane's own prefill within that is charged as measured.
    shortest = race.shared_prefill_s
    assert shortest == min(o.prefill_s for o in others) < SLEEP_S
    assert ar.charged_prefill_s(shortest) == pytest.approx(PREFILL_SPREAD * shortest)
    assert ar.total_tokens_per_s(shortest) == pytest.approx(ar.n_tokens / (ar.compute_s + PREFILL_SPREAD * shortest))
    for o in others:
        assert o.charged_prefill_s(shortest) == min(o.prefill_s, PREFILL_SPREAD * shortest)


def test_without_a_cost_curve_the_clock_is_the_wall_clock(lm):
    lm.cost_curve = None
    restore = sleepy(lm, every=3)
    try:
        race = run(Race(lm, prompt(), {"ar": make_drafter("ar")}, DecodeConfig(max_new_tokens=12)))
    finally:
        restore()
    ar = race.lanes["ar"]
    assert ar.disturbed_steps == 0 and ar.compute_s >= (ar.forwards // 3) * SLEEP_S


def test_the_page_says_how_many_forwards_were_disturbed_and_gives_a_series_median(lm):
    from racer_app.format import disturbed_md, lane_stats_md, race_record, series_md
    sizes = [1, 2, 4, 8, 16, 32, 64]
    curve = CostCurve(sizes, [64, 512], [[2.0] * len(sizes)] * 2, {"test": "tight"})
    restore = sleepy(lm, every=4)
    try:
        race = run(Race(lm, prompt(), {m: make_drafter(m, vocab_size=V) for m in ("racer", "ar")},
                        DecodeConfig(max_new_tokens=16, capacity=8), cost_curve=curve))
    finally:
        restore()
    n = sum(ln.disturbed_steps for ln in race.lanes.values())
    of = sum(ln.checked_forwards for ln in race.lanes.values())
    assert n > 0
    note = disturbed_md(race.lanes)
    assert f"{n} of {of} forward passes" in note
    assert ("machine was busy" in note) == (n >= 0.05 * of)
    ar = race.lanes["ar"]
    assert f"{ar.disturbed_steps} of {ar.checked_forwards} forwards disturbed" in lane_stats_md(ar, running=False)
    # A series of three: the medians and ranges of what each race reported.
    rec = race_record(race.lanes, race.shared_prefill_s)
    series = []
    for k in (1.0, 2.0, 4.0):          # the same race with RACER's speed scaled: medians are the middle one
        r = {**rec, "lanes": {m: dict(v) for m, v in rec["lanes"].items()},
             "speedups": {m: {kk: vv * k for kk, vv in v.items()} for m, v in rec["speedups"].items()}}
        r["lanes"]["ar"]["tokens_per_s"] = 10.0 * k
        series.append(r)
    up = rec["speedups"]["racer"]
    md = series_md(series, 3)
    assert f"RACER **{2 * up['decode']:.2f}×** ({up['decode']:.2f}–{4 * up['decode']:.2f})" in md
    assert f"{3 * n} of {3 * of} forward passes" in md
    assert "Median of 3 races: **20.0** tok/s (10.0–40.0)" in lane_stats_md(ar, running=False, series=series)
    assert "2 were" not in series_md(series, 3) and "3 were asked for" in series_md(series[:2], 3)


def test_a_few_hiccups_are_not_called_a_busy_machine():
    from types import SimpleNamespace
    from racer_app.format import disturbed_md
    def lane(disturbed: int, checked: int) -> SimpleNamespace:
        return SimpleNamespace(disturbed_steps=disturbed, estimated_steps=disturbed, checked_forwards=checked,
                               prefill_disturbed=False)
    lanes = {"racer": lane(1, 30), "ar": lane(2, 127)}
    note = disturbed_md(lanes)
    assert "3 of 157 forward passes (RACER 1, Plain autoregressive 2)" in note and "busy" not in note
    lanes["ar"].disturbed_steps = 20
    assert "machine was busy" in disturbed_md(lanes)
    lanes = {m: lane(0, 30) for m in ("racer", "ar")}
    assert disturbed_md(lanes) == ""


def test_picture_data_is_timed_apart_and_not_charged(lm):
    # The page's pictures (detail) are the drafter's own timed block: they reach the step as
    # timings["picture_ms"], stay out of draft_ms (what the sizer learns from) and off the clock.
    drafters = {m: make_drafter(m, vocab_size=V) for m in ("racer", "ar")}
    automaton = drafters["racer"].automaton
    real_snapshot = automaton.snapshot

    def slow_snapshot(*a, **kw):
        time.sleep(0.02)
        return real_snapshot(*a, **kw)
    automaton.snapshot = slow_snapshot
    race = Race(lm, prompt(), drafters, DecodeConfig(max_new_tokens=16, capacity=8), cost_curve=generous_curve())
    recs = [rec for lane, rec in race if lane.method == "racer" and rec.forwarded]
    racer = race.lanes["racer"]
    assert recs and all(r.timings["picture_ms"] >= 20 and r.timings["draft_ms"] < 20 for r in recs)
    assert racer.compute_s < len(recs) * 0.02


def test_a_busy_machine_does_not_change_what_a_sized_lane_drafts(lm):
    # Sizers learn nothing from a disturbed forward: planted sleeps on every 3rd forward leave
    # the trees (hence the tokens and the forwards) exactly those of a quiet race with the same
    # timing otherwise. The curve is tight, so a sleep is disturbed and a tiny real forward is not.
    from racer.sizing import Sizer
    sizes = [1, 2, 4, 8, 16, 32, 64]
    curve = CostCurve(sizes, [64, 512], [[5.0 + 0.1 * s for s in sizes]] * 2, {"test": "tight"})

    def race_once(sleep_every: int | None, skip: bool = True):
        sizer = Sizer(curve, skip_disturbed=skip, calibrate=True)
        # Quiet forwards all look alike to the sizer (the curve's own time), so only the
        # disturbed ones could change its choices.
        observe = sizer.observe

        def steady(tree, accepted, timings, **kw):
            if timings.get("forward_ms", 0.0) < SLEEP_S * 1e3:
                # The overhead stays at its starting 1 ms, the calibration at 1.
                timings = {"forward_ms": curve.t(len(tree), 64), "draft_ms": 1.0}
            observe(tree, accepted, timings, **kw)
        sizer.observe = steady
        restore = sleepy(lm, every=sleep_every) if sleep_every else (lambda: None)
        try:
            race = Race(lm, prompt(), {"racer": make_drafter("racer", vocab_size=V)},
                        DecodeConfig(max_new_tokens=48, capacity="auto"), cost_curve=curve,
                        run_kwargs={"racer": {"sizer": sizer}})
            sizes = [len(rec.tree) for _, rec in race if rec.forwarded]
        finally:
            restore()
        return race.lanes["racer"], sizer, sizes

    quiet, qs, quiet_sizes = race_once(None)
    busy, bs, busy_sizes = race_once(3)
    assert busy.disturbed_steps >= 2
    assert busy_sizes == quiet_sizes and busy.tokens == quiet.tokens
    assert bs.calibration.factors(64) == qs.calibration.factors(64) and bs.overhead_ms == qs.overhead_ms == 1.0
    # A sizer that learns from them too (version-1 traces) drafts other trees under the same load.
    _, _, learning_sizes = race_once(3, skip=False)
    assert learning_sizes != quiet_sizes


def test_a_lane_that_finished_before_any_level_was_known_is_settled_once_one_is(lm):
    """The machine is busy for the race's first forwards and quiet after: RACER, given few tokens,
    ends while every forward so far was disturbed and no level is known (no earlier quiet race);
    plain decoding's later, undisturbed forwards then give one, and RACER's disturbed steps must
    be charged by it too, not left at their wall time."""
    curve = tight_curve()
    real, calls = lm.model.forward, [0]

    def busy_first(*a, **kw):
        calls[0] += 1
        if calls[0] <= 12:
            time.sleep(SLEEP_S)
        return real(*a, **kw)
    lm.model.forward = busy_first
    try:
        race = run(Race(lm, prompt(), {"racer": make_drafter("racer", vocab_size=V), "ar": make_drafter("ar")},
                        DecodeConfig(max_new_tokens=32, capacity=8),
                        configs={"racer": DecodeConfig(max_new_tokens=4, capacity=8)},
                        cost_curve=curve, levels=QuietLevels()))
    finally:
        lm.model.forward = real
    r, ar = race.lanes["racer"], race.lanes["ar"]
    assert r.disturbed_steps == r.checked_forwards > 0            # RACER never saw a quiet forward
    assert ar.checked_forwards - ar.disturbed_steps >= QuietLevels.MIN
    assert r.estimated_steps == r.disturbed_steps and r.compute_s < SLEEP_S
