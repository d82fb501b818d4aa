"""The race's clock (racer.race): each lane charged its own compute; a forward far above its lane's
typical time (level from the lane, shape from the cost curve) is charged the typical time and
counted; the whole-request figure charges every lane the shortest prefill. Disturbance is planted
(a forward that sleeps), so the checks do not depend on how busy the test machine is."""
from __future__ import annotations

import random
import time

import pytest

from racer import DecodeConfig, make_drafter
from racer.costcurve import CostCurve
from racer.race import DISTURBED, Race
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
        assert lane.disturbed_steps == 0 and lane.discounted_s == 0.0
        assert lane.compute_s > 0 and lane.prefill_s > 0 and lane.points[0] == (0.0, 0)
        assert lane.total_tokens_per_s(race.shared_prefill_s) < lane.tokens_per_s
    assert min(ln.prefill_s for ln in race.lanes.values()) <= race.shared_prefill_s \
        <= max(ln.prefill_s for ln in race.lanes.values())


def test_disturbed_forwards_are_charged_their_lanes_typical_time(lm):
    # A curve 50x too slow: only its shape matters, the level comes from the lane's own forwards.
    expected_ms = 100.0
    sizes = [1, 2, 4, 8, 16, 32, 64]
    curve = CostCurve(sizes, [64, 512], [[expected_ms] * len(sizes)] * 2, {"test": "flat"})
    restore = sleepy(lm, every=4)
    try:
        race = run(Race(lm, prompt(), {"ar": make_drafter("ar")}, DecodeConfig(max_new_tokens=24), cost_curve=curve))
    finally:
        restore()
    ar = race.lanes["ar"]
    slept = ar.forwards // 4
    typical_ms = ar.scale * expected_ms
    assert typical_ms < SLEEP_S * 1e3 / 10          # the level is the quiet forwards', not the sleeps'
    assert ar.disturbed_steps >= slept - 1          # the prefill's sleep, if any, is the prefill's business
    # None of the planted sleeps is on the lane's clock.
    assert ar.compute_s < slept * SLEEP_S
    assert ar.discounted_s >= (slept - 1) * (SLEEP_S - DISTURBED * typical_ms / 1e3)
    # The drawn points end at the settled clock.
    assert ar.points[-1][0] <= ar.compute_s + 1e-9 and ar.points[-1][1] == ar.n_tokens


def test_a_curve_wrong_by_a_constant_factor_changes_nothing(lm):
    """The level is the lane's own, the curve only gives the shape: the same steps judged against
    a curve 100x too fast, right, or 100x too slow are charged alike."""
    race = Race(lm, prompt(), {"ar": make_drafter("ar")}, DecodeConfig(max_new_tokens=4))
    rng = random.Random(1)
    # (seconds, forward ms, curve ms): quiet forwards whose cost grows with tree size, 3 stalled ones.
    steps = []
    for i in range(30):
        size_ms = 10.0 + (i % 3) * 5.0
        fwd = size_ms * rng.uniform(0.95, 1.15) * (4.0 if i in (5, 17, 23) else 1.0)
        steps.append((fwd / 1e3 + 0.001, fwd, size_ms))
    charged = []
    for k in (0.01, 1.0, 100.0):
        lane = race.lanes["ar"]
        lane.charges = [(dt, f, e * k) for dt, f, e in steps]
        race._reckon(lane)
        assert lane.disturbed_steps == 3, k
        charged.append(lane.compute_s)
    assert max(charged) - min(charged) < 1e-9
    wall = sum(dt for dt, _, _ in steps)
    assert charged[0] < wall - 3 * 0.025          # each stall (3x extra of >= 10 ms) left out


def test_the_wall_clock_counts_disturbed_steps_but_charges_them_in_full(lm):
    sizes = [1, 2, 4, 8, 16, 32, 64]
    curve = CostCurve(sizes, [64, 512], [[2.0] * len(sizes)] * 2, {"test": "tight"})
    restore = sleepy(lm, every=4)
    try:
        race = run(Race(lm, prompt(), {"ar": make_drafter("ar")}, DecodeConfig(max_new_tokens=24),
                        cost_curve=curve, clock="wall"))
    finally:
        restore()
    ar = race.lanes["ar"]
    assert ar.disturbed_steps >= ar.forwards // 4 - 1 and ar.discounted_s == 0.0
    assert ar.compute_s >= (ar.forwards // 4 - 1) * SLEEP_S
    with pytest.raises(ValueError, match="clock"):
        Race(lm, prompt(), {"ar": make_drafter("ar")}, clock="cpu")


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
    # A whole-request comparison adds the shortest prefill, which the one slowed prefill does not move.
    assert race.shared_prefill_s == min(o.prefill_s for o in others) < SLEEP_S


def test_without_a_cost_curve_the_clock_is_the_wall_clock(lm):
    lm.cost_curve = None
    restore = sleepy(lm, every=3)
    try:
        race = run(Race(lm, prompt(), {"ar": make_drafter("ar")}, DecodeConfig(max_new_tokens=12)))
    finally:
        restore()
    ar = race.lanes["ar"]
    assert ar.disturbed_steps == 0 and ar.compute_s >= (ar.forwards // 3) * SLEEP_S
