"""How the cost curve is timed: rounds over every size until the fastest times hold steady."""
from __future__ import annotations

import time as real_time
from types import SimpleNamespace

import pytest

from racer import costcurve
from racer.tiny import tiny_lm


def timed_rounds(monkeypatch, ms_of, **kw) -> tuple[list[int], costcurve.CostCurve]:
    """Rounds `costcurve.measure` times per context (its warm-up round left out), each forward
    taking `ms_of(round, size)` on a fake clock, and the curve it returns."""
    clock = SimpleNamespace(t=0.0, round=0)
    real_forward = costcurve.forward_tree

    def forward(model, cache, tree, *args):
        out = real_forward(model, cache, tree, *args)
        clock.t += ms_of(clock.round, len(tree)) / 1e3
        return out

    rounds: list[int] = []

    def progress(msg: str) -> None:
        clock.round = int(msg.split(" round ")[1].split()[0]) - 1     # 0 = the warm-up round
        if clock.round == 0:
            rounds.append(0)
        else:
            rounds[-1] = clock.round

    monkeypatch.setattr(costcurve, "forward_tree", forward)
    monkeypatch.setattr(costcurve, "time", SimpleNamespace(perf_counter=lambda: clock.t, strftime=real_time.strftime))
    curve = costcurve.measure(tiny_lm(vocab=64), sizes=(1, 2, 4), progress=progress, **kw)
    return rounds, curve


def test_steady_times_stop_the_rounds_once_they_held_for_steady_rounds(monkeypatch):
    rounds, curve = timed_rounds(monkeypatch, lambda r, size: 10.0 + size, max_rounds=25)
    # the first timed round sets the fastest times; the next STEADY_ROUNDS lower none of them
    assert rounds and all(n == 1 + costcurve.STEADY_ROUNDS for n in rounds)
    assert all(row == pytest.approx([11.0, 12.0, 14.0]) for row in curve.ms)


def test_times_that_keep_falling_are_timed_up_to_max_rounds(monkeypatch):
    # a machine growing quieter: every round 5 % faster than the one before
    rounds, curve = timed_rounds(monkeypatch, lambda r, size: (10.0 + size) * 0.95 ** r, max_rounds=12)
    assert rounds and all(n == 12 for n in rounds)
    assert all(row == pytest.approx([(10.0 + s) * 0.95 ** 12 for s in (1, 2, 4)]) for row in curve.ms)


def test_one_size_getting_faster_keeps_the_rounds_going(monkeypatch):
    # only the one-token forward's time falls, 10 % a round until round 9: the rounds run until
    # five rounds after it stopped falling
    rounds, _ = timed_rounds(monkeypatch, lambda r, size: 20.0 * 0.9 ** min(r, 9) if size == 1 else 30.0,
                             max_rounds=25)
    assert rounds and all(n == 9 + costcurve.STEADY_ROUNDS for n in rounds)


def test_without_max_rounds_the_curve_takes_exactly_repeats_rounds(monkeypatch):
    rounds, _ = timed_rounds(monkeypatch, lambda r, size: 10.0 * 0.9 ** r, repeats=3)
    assert rounds and all(n == 3 for n in rounds)
