"""A fair race of several decode methods on one device.

    race = Race(lm, input_ids, {"racer": make_drafter("racer", ...), "ar": ..., "tr": ...}, cfg)
    for lane, step in race:        # one (Lane, StepRecord) per step of whichever method ran
        ...
    race.lanes["racer"].tokens, race.compare()

One loop owns every method's `DecodeRun` iterator and always advances the method with the
least of its *own* accumulated decoding time (its steps, measured with `perf_counter` around
each `next()`; `DecodeRun` synchronises the GPU inside each step). So at
any moment every lane shows what its method had produced after the same amount of its own
work, on one device, without the methods competing for it. Picture data (`detail=True`) is
only asked of the methods in `detail_for`; the drafting time it adds (draft time beyond the
drafter's own `draft_breakdown`) is not charged to that lane's clock.

The prefill is kept apart: every lane reads the same prompt once before its first step, so the
lanes' clocks all start at zero after it, each lane's prefill is reported as measured, and
`shared_prefill_s` (the lanes' median) is what a whole-request comparison adds to every lane.

A clock that holds when the machine is shared. Another process, another visitor or the page's
own updates stall a forward now and then, and charged at wall time those stalls decide the
race. So every verify forward is compared with what its lane's forwards typically take at its
tree size and context: the machine's cost curve gives the shape (how the time grows with tree
size and context), the lane's own median of measured/predicted gives the level (so the curve's
absolute error, measured once on random trees, does not favour a lane). A forward that took more
than DISTURBED x that is charged the typical time instead and counted as disturbed; the rest of
the step (drafting, acceptance) stays at wall time. The typical level is re-estimated as the
lane runs and settled over all its steps at the end, when every lane's time is recomputed.
On a quiet machine (docs/PERFORMANCE.md, "The race's clock": no forward of a quiet race exceeds
1.2x its lane's typical time) no step is discounted and the clock is the wall clock.

Do not use `DecodeRun.result.tokens_per_s` of a raced run: its wall clock includes the time
the other lanes ran. The lane's `tokens_per_s` uses the lane's own compute time.
"""
from __future__ import annotations

import dataclasses
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

from .costcurve import CostCurve
from .drafters.base import Drafter
from .loop import DecodeConfig, DecodeRun
from .models import LoadedModel
from .records import DecodeResult, StepRecord, mean_accepted

#: A forward this many times its lane's typical time (for its tree size and context) was disturbed.
DISTURBED = 1.5
#: Forwards a lane needs before its typical level is estimated (and anything is called disturbed).
MIN_TYPICAL = 3
#: "charged": a disturbed forward is charged the cost curve's prediction; "wall": wall time only.
CLOCKS = ("charged", "wall")


@dataclass
class Lane:
    """One method's progress in a race."""
    method: str
    run: DecodeRun
    detail: bool = False
    compute_s: float = 0.0              # own decoding compute: its steps (prefill and picture overhead excluded)
    prefill_s: float = 0.0              # its prefill, as measured
    disturbed_steps: int = 0            # steps charged their typical forward time
    discounted_s: float = 0.0           # forward time not charged: what disturbed forwards took beyond typical
    scale: float | None = None          # the lane's median measured / cost-curve forward time
    #: Per step: (seconds, the forward's measured ms, the cost curve's ms or None when not forwarded).
    charges: list[tuple[float, float, float | None]] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    steps: int = 0                      # step records (each commits >= 1 token)
    forwards: int = 0                   # verification forwards, the prefill's included
    points: list[tuple[float, int]] = field(default_factory=lambda: [(0.0, 0)])
    started: bool = False
    done: bool = False
    stop_reason: str | None = None
    result: DecodeResult | None = None
    last_info: dict[str, Any] = field(default_factory=dict)

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def mat(self) -> float:
        return mean_accepted(self.n_tokens, self.forwards)

    @property
    def tokens_per_s(self) -> float:
        """Tokens per second of decoding (the prefill left out)."""
        return self.n_tokens / self.compute_s if self.compute_s > 0 else 0.0

    def total_tokens_per_s(self, prefill_s: float) -> float:
        """Tokens per second of the whole request, with `prefill_s` for the prefill."""
        total = self.compute_s + prefill_s
        return self.n_tokens / total if total > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        return {"method": self.method, "tokens": self.n_tokens, "steps": self.steps, "forwards": self.forwards,
                "mat": round(self.mat, 4), "tokens_per_s": round(self.tokens_per_s, 3),
                "compute_s": round(self.compute_s, 4), "prefill_s": round(self.prefill_s, 4),
                "disturbed_steps": self.disturbed_steps,
                "discounted_s": round(self.discounted_s, 4),
                "scale": None if self.scale is None else round(self.scale, 3), "done": self.done, "stop_reason": self.stop_reason}


@dataclass
class Comparison:
    """Whether the lanes produced the same tokens (they must under greedy decoding)."""
    identical: bool
    compared: int                       # tokens compared (the shortest lane's length)
    first_diff: int | None              # token index of the first difference, if any
    lengths: dict[str, int]
    tokens_at_diff: dict[str, list[int]] = field(default_factory=dict)


class Race:
    """Iterate to race; see the module doc. `stop_event` ends the race promptly (every lane
    stops at its next step boundary); `time_limit_s` bounds the whole race's wall time.
    `configs` overrides the shared config per method; `run_kwargs` adds per-method `DecodeRun`
    arguments (e.g. a tree sizer)."""

    def __init__(self, lm: LoadedModel, input_ids: list[int], drafters: Mapping[str, Drafter],
                 config: DecodeConfig | None = None, *, detail_for: tuple[str, ...] = ("racer",),
                 configs: Mapping[str, DecodeConfig] | None = None,
                 run_kwargs: Mapping[str, dict[str, Any]] | None = None,
                 stop_event: threading.Event | None = None, time_limit_s: float | None = None,
                 new_from: int = 0, cost_curve: CostCurve | None = None, clock: str = "charged") -> None:
        """`cost_curve` (default: the model's, once measured) tells a disturbed forward; without
        one the clock is the wall clock alone. `clock="wall"` charges every step its wall time
        even when disturbed (for measuring what the busy-step charge changes)."""
        if not drafters:
            raise ValueError("a race needs at least one method")
        if clock not in CLOCKS:
            raise ValueError(f"clock must be one of {', '.join(CLOCKS)}; got {clock!r}")
        self.curve = cost_curve if cost_curve is not None else lm.cost_curve
        self.clock = clock
        base = config or DecodeConfig()
        self.stop_event = stop_event
        self.time_limit_s = time_limit_s
        # One internal event stops every run (an external stop or the race's own time limit).
        self._halt = threading.Event()
        self.stop_reason: str | None = None
        self.lanes: dict[str, Lane] = {}
        for method, drafter in drafters.items():
            cfg = (configs or {}).get(method, base)
            cfg = dataclasses.replace(cfg, detail=method in detail_for)
            extra = dict((run_kwargs or {}).get(method) or {})
            run = DecodeRun(lm, input_ids, drafter, cfg, stop_event=self._halt, new_from=new_from, **extra)
            self.lanes[method] = Lane(method, run, detail=cfg.detail)
        self.wall_s = 0.0

    # -- scheduling ------------------------------------------------------------------------

    def _next_lane(self) -> Lane | None:
        live = [ln for ln in self.lanes.values() if not ln.done]
        if not live:
            return None
        return min(live, key=lambda ln: ln.compute_s)

    def _should_halt(self, t0: float) -> str | None:
        if self.stop_event is not None and self.stop_event.is_set():
            return "stopped"
        if self.time_limit_s is not None and time.perf_counter() - t0 > self.time_limit_s:
            return "time_limit"
        return None

    def __iter__(self) -> Iterator[tuple[Lane, StepRecord]]:
        t0 = time.perf_counter()
        iters: dict[str, Iterator[StepRecord]] = {}
        try:
            while True:
                reason = self._should_halt(t0)
                if reason:
                    self.stop_reason = reason
                    self._halt.set()
                    self._drain(iters, reason)
                    break
                lane = self._next_lane()
                if lane is None:
                    break
                it = iters.get(lane.method)
                if it is None:
                    it = iters[lane.method] = iter(lane.run)
                    lane.started = True
                    lane.forwards = 1          # its first next() runs the prefill
                t = time.perf_counter()
                try:
                    rec = next(it)
                except StopIteration:      # the run's end: its last bookkeeping, no forward
                    lane.charges.append((time.perf_counter() - t, 0.0, None))
                    self._reckon(lane)
                    self._finish(lane)
                    continue
                dt = max(0.0, time.perf_counter() - t - self._picture_overhead(lane, rec))
                if lane.steps == 0 and lane.run.prefill_ms is not None:
                    # The first next() ran the prefill too: it is kept apart from the decoding clock.
                    lane.prefill_s = min(dt, lane.run.prefill_ms / 1e3)
                    dt -= lane.prefill_s
                self._charge(lane, rec, dt)
                lane.steps += 1
                lane.forwards += 1 if rec.forwarded else 0
                lane.tokens.extend(rec.committed)
                lane.points.append((lane.compute_s, lane.n_tokens))
                lane.last_info = rec.info
                yield lane, rec
            self._settle()
        finally:
            self.wall_s = time.perf_counter() - t0
            for ln in self.lanes.values():
                if not ln.started and not ln.done:
                    ln.stop_reason = ln.stop_reason or self.stop_reason or "not_started"

    def _charge(self, lane: Lane, rec: StepRecord, dt: float) -> None:
        """Record the step and re-add the lane's clock with its current typical level (see the
        module doc); the points drawn so far keep the times they were drawn with."""
        expected = None
        if self.curve is not None and rec.forwarded:
            expected = self.curve.t(len(rec.tree), rec.context_len)
        lane.charges.append((dt, float(rec.timings.get("forward_ms", 0.0)), expected))
        self._reckon(lane)

    def _reckon(self, lane: Lane) -> list[float]:
        """The lane's clock from its recorded steps; returns the charged seconds per step."""
        ratios = sorted(f / e for _, f, e in lane.charges if e and f > 0)
        lane.scale = statistics.median(ratios) if len(ratios) >= MIN_TYPICAL else None
        out, n, saved = [], 0, 0.0
        for dt, f, e in lane.charges:
            cut = 0.0
            if lane.scale is not None and e and f > DISTURBED * lane.scale * e:
                cut = min(dt, (f - lane.scale * e) / 1e3)
                n += 1
            if self.clock == "wall":
                cut = 0.0                    # counted, still charged in full
            saved += cut
            out.append(dt - cut)
        lane.disturbed_steps, lane.discounted_s, lane.compute_s = n, saved, sum(out)
        return out

    def _settle(self) -> None:
        """At the end: every lane's clock and points from its typical level over all its steps."""
        for lane in self.lanes.values():
            if not lane.charges:
                continue
            per_step = self._reckon(lane)
            t, pts = 0.0, [(0.0, 0)]
            for (_, n_tok), dt in zip(lane.points[1:], per_step):
                t += dt
                pts.append((t, n_tok))
            lane.points = pts

    @staticmethod
    def _picture_overhead(lane: Lane, rec: StepRecord) -> float:
        if not lane.detail:
            return 0.0
        parts = rec.info.get("draft_breakdown")
        if not isinstance(parts, dict):
            return 0.0
        extra = float(rec.timings.get("draft_ms", 0.0)) - sum(float(v) for v in parts.values())
        return max(0.0, extra) / 1e3

    def _finish(self, lane: Lane) -> None:
        lane.done = True
        lane.result = lane.run.result
        if lane.result is not None:
            lane.stop_reason = lane.result.stop_reason
            lane.prefill_s = lane.result.prefill_ms / 1e3

    def _drain(self, iters: dict[str, Iterator[StepRecord]], reason: str) -> None:
        """After a halt, let every started run reach its stop check (no forward happens)."""
        for lane in self.lanes.values():
            if lane.done:
                continue
            it = iters.get(lane.method)
            if it is not None:
                for _ in range(4):
                    try:
                        rec = next(it)
                    except StopIteration:
                        break
                    # A step that was already computed before the halt: keep its tokens.
                    lane.steps += 1
                    lane.forwards += 1 if rec.forwarded else 0
                    lane.tokens.extend(rec.committed)
            self._finish(lane)
            if lane.stop_reason in (None, "stopped"):
                lane.stop_reason = reason

    # -- results ----------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        return all(ln.done for ln in self.lanes.values())

    @property
    def shared_prefill_s(self) -> float:
        """The prefill every lane does alike (the same prompt, the same work): the shortest of the
        lanes' measured prefills, the one least disturbed by other work, so a busy moment during
        one prefill does not decide a whole-request comparison."""
        xs = [ln.prefill_s for ln in self.lanes.values() if ln.steps]
        return min(xs) if xs else 0.0

    @property
    def disturbed_steps(self) -> int:
        return sum(ln.disturbed_steps for ln in self.lanes.values())

    def compare(self) -> Comparison:
        """Token-by-token comparison of every lane against the first, up to the shortest."""
        lanes = list(self.lanes.values())
        lengths = {ln.method: ln.n_tokens for ln in lanes}
        n = min(lengths.values()) if lengths else 0
        first = None
        for i in range(n):
            if len({ln.tokens[i] for ln in lanes}) > 1:
                first = i
                break
        at = {}
        if first is not None:
            at = {ln.method: ln.tokens[first:first + 6] for ln in lanes}
        return Comparison(first is None, n, first, lengths, at)

    def summary(self) -> dict[str, Any]:
        cmp = self.compare()
        return {"lanes": {m: ln.summary() for m, ln in self.lanes.items()}, "wall_s": round(self.wall_s, 4),
                "shared_prefill_s": round(self.shared_prefill_s, 4), "disturbed_steps": self.disturbed_steps,
                "stop_reason": self.stop_reason, "identical": cmp.identical, "compared": cmp.compared,
                "first_diff": cmp.first_diff}
