"""The race's clock (racer.race): each lane charged its own compute; a forward the machine's cost
curve says was disturbed is charged the curve's time and counted; a prefill far above the lanes'
median is charged the median. Disturbance is planted (a forward that sleeps), so the checks do
not depend on how busy the test machine is."""
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


def test_disturbed_forwards_are_charged_the_cost_curve(lm):
    expected_ms = 2.0
    sizes = [1, 2, 4, 8, 16, 32, 64]
    curve = CostCurve(sizes, [64, 512], [[expected_ms] * len(sizes)] * 2, {"test": "tight"})
    restore = sleepy(lm, every=4)
    try:
        race = run(Race(lm, prompt(), {"ar": make_drafter("ar")}, DecodeConfig(max_new_tokens=24), cost_curve=curve))
    finally:
        restore()
    ar = race.lanes["ar"]
    slept = ar.forwards // 4
    assert ar.disturbed_steps >= slept - 1          # the prefill's sleep, if any, is the prefill's business
    # None of the planted sleeps is on the lane's clock.
    assert ar.compute_s < slept * SLEEP_S
    assert ar.discounted_s >= (slept - 1) * (SLEEP_S - DISTURBED * expected_ms / 1e3)


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
    # A whole-request comparison adds the median prefill, which the one slowed prefill does not move.
    assert race.shared_prefill_s <= max(o.prefill_s for o in others) < SLEEP_S


def test_without_a_cost_curve_the_clock_is_the_wall_clock(lm):
    lm.cost_curve = None
    restore = sleepy(lm, every=3)
    try:
        race = run(Race(lm, prompt(), {"ar": make_drafter("ar")}, DecodeConfig(max_new_tokens=12)))
    finally:
        restore()
    ar = race.lanes["ar"]
    assert ar.disturbed_steps == 0 and ar.compute_s >= (ar.forwards // 3) * SLEEP_S
