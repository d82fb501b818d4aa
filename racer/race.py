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
only asked of the methods in `detail_for`; the time it takes (the drafter times it:
`timings["picture_ms"]`) is not charged to that lane's clock.

The prefill is kept apart: every lane reads the same prompt once before its first step, so the
lanes' clocks all start at zero after it, and each lane's prefill is reported as measured. It is
nearly the same work in every lane (RACER and Token Recycling also read the top-k at the prompt's
positions and build their tables: 5-10 % more on the default model), so a whole-request
comparison charges each lane its own prefill but at most `PREFILL_SPREAD` x the race's shortest
(`shared_prefill_s`): a prefill longer than that was slowed by other work, which must not decide
the comparison. A prefill is judged like a forward, against the cost curve's prefill time for its
tokens (`CostCurve.prefill`, timed at prompt lengths of 16-2048) and the method's prefill level
from earlier quiet races; a disturbed one is charged that quiet estimate.

What the clock leaves out: the page's work (building and sending frames happens between steps,
outside the timed `next()`, and the garbage collection that work causes is held off during a
timed step: `DecodeRun` holds it off per step, racer.collector), the server's own decodes (the
app's warm-up and every visitor's decode hold one decode slot, so none runs beside a race) and
each lane's prefill. What it cannot
keep out is load the race cannot stop: another visitor's inspector, another process. Each step is
charged its wall time unless its forward was disturbed: took more than `SLOWED` x what such a
forward of the method takes on this machine when it is quiet (the cost curve's time for its tree
size and context x the method's quiet level, below), or more than `racer.sizing.DISTURBED` x the
curve's time (the only line before any quiet race has taught a level). The first line catches a
slowdown that stays under the second: a host running every forward 20-40 % slow for a while
(a neighbour's load) charged plain decoding, with three times RACER's forwards, the most, and
read RACER's speed-up up to 17 % high (docs/PERFORMANCE.md, "The race's clock"). A disturbed step is charged
what that forward takes on this machine when it is quiet, the curve's time x the method's *quiet
level* (the median ratio of measured to predicted over its undisturbed forwards in the last
quiet races: `QuietLevels`, kept with the curve), its whole step scaled alike. Why not wall
time: a stall costs every forward about the same, and plain decoding makes several times RACER's
forwards, so under load wall time lifts RACER's speed-up (12-16 % on the app's server beside a
second client, up to 75 % from a browser) and every lane's tokens/s falls to a fraction of the
machine's; why not the bare curve: it is the
*fastest* of several measurements on random trees, 5-25 % below a real decode's typical forward,
differently per method (docs/PERFORMANCE.md, "The race's clock"). Each lane keeps both clocks
(`compute_s`, `wall_compute_s`) and the count of disturbed forwards for the page to report. And
the load does not change what the lanes draft: the tree sizers learn nothing from a disturbed
forward (`Sizer(skip_disturbed=True)`), so a busy machine slows every lane without making RACER
draft smaller trees than it would on a quiet one.

Do not use `DecodeRun.result.tokens_per_s` of a raced run: its wall clock includes the time
the other lanes ran. The lane's `tokens_per_s` uses the lane's own compute time.
"""
from __future__ import annotations

import dataclasses
import statistics
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

from .costcurve import CostCurve
from .drafters.base import Drafter
from .loop import DecodeConfig, DecodeRun
from .models import LoadedModel
from .records import DecodeResult, StepRecord, mean_accepted
from .sizing import disturbed

#: Below this share of disturbed forwards a race's page calls them hiccups, above it a busy machine.
BUSY_SHARE = 0.05
#: Below this share of disturbed forwards a race teaches the quiet levels: a shared machine's
#: background flags 3-10 % of a quiet race's forwards; a second client in the inspector, 45-90 %;
#: a neighbour's light load, 53-71 % (before the SLOWED line it often flagged under 20 %, and such races
#: taught levels 6-19 % high, which later races were charged by).
LEARN_SHARE = 0.2
#: A forward above this many times its quiet estimate (the curve's time x the method's quiet level)
#: was slowed by other work. Quiet races put 0-10 % of a method's forwards above it (a few %
#: typically); a neighbour's light load (a process busy 5 ms in every 20), 53-71 %, while most of
#: them stayed under DISTURBED x the curve.
SLOWED = 1.25
#: A lane's prefill above this many times the race's shortest was slowed by other work.
PREFILL_SPREAD = 1.25
#: QuietLevels keys the prefills' levels by this prefix and the method (one prefill a lane a race).
PREFILL = "prefill:"


def _median_level(ratios: Mapping[str, Any], method: str, least: int, pooled: bool) -> float | None:
    """The median of `method`'s ratios (with `pooled`: of all methods' forwards together, the
    prefills' left out); None while there are fewer than `least`."""
    xs = ([r for m, xs in ratios.items() if not m.startswith(PREFILL) for r in xs] if pooled
          else list(ratios.get(method, ())))
    return statistics.median(xs) if len(xs) >= least else None


class QuietLevels:
    """How this machine's forwards compare with its cost curve when it is quiet, per method: for
    each of the last `RACES` quiet races (under `LEARN_SHARE` of their forwards disturbed), each
    method's median of measured / predicted over its undisturbed forwards; a method's level is the
    median of those. The curve keeps the fastest of several timings of random trees, so a real
    decode's typical forward sits apart from it, by how much depending on the method (its tree
    sizes, its drafting between forwards) and on how fast the shared machine runs that hour:
    0.95-1.15 on the default model (docs/PERFORMANCE.md, "The race's clock").

    Whole races only, so every method's level comes from the same minutes (the lanes take turns):
    a level learnt at another time would tilt the speed-ups by the machine's drift. Quiet races
    only: under partial load the undisturbed forwards are slowed too (below the disturbed line),
    and a level learnt from them would charge the disturbed ones for the load after all.
    Thread-safe."""

    #: Quiet races whose levels are kept: single quiet races' speed-ups spread 10-20 % on a shared
    #: 2-core host, and under full load the charged speed-up follows the levels' ratio.
    RACES = 5
    #: Fewer undisturbed forwards than this and a method's median is not taken.
    MIN = 8

    def __init__(self) -> None:
        self._races: deque[dict[str, float]] = deque(maxlen=self.RACES)
        self._lock = threading.Lock()

    def learn(self, ratios: Mapping[str, list[float]]) -> None:
        """One quiet race: per method, measured / predicted ms of its undisturbed forwards (and
        under `PREFILL` + method, of its prefill)."""
        medians = {m: statistics.median(xs) for m, xs in ratios.items()
                   if len(xs) >= (1 if m.startswith(PREFILL) else self.MIN)}
        if medians:
            with self._lock:
                self._races.append(medians)

    def level(self, method: str, pooled: bool = False) -> float | None:
        """The method's quiet level (with `pooled`: every method's together); None while no quiet
        race has taught one."""
        with self._lock:
            per = {m: [r[m] for r in self._races if m in r] for r in self._races for m in r}
        return _median_level(per, method, 1, pooled)


def quiet_levels(curve: CostCurve) -> QuietLevels:
    """The quiet levels learnt against `curve` (kept with it: a ratio to one curve means nothing
    against another)."""
    levels = curve.__dict__.get("_quiet_levels")
    if levels is None:
        levels = curve.__dict__["_quiet_levels"] = QuietLevels()
    return levels


@dataclass
class Lane:
    """One method's progress in a race."""
    method: str
    run: DecodeRun
    compute_s: float = 0.0              # own decoding time charged: its steps (prefill and picture overhead excluded)
    wall_compute_s: float = 0.0         # the same steps at wall time
    prefill_s: float = 0.0              # its prefill, as measured
    prefill_expected_ms: float | None = None   # the cost curve's time for the prefill's tokens
    prefill_level: float | None = None  # this method's prefill quiet level, from earlier quiet races
    disturbed_steps: int = 0            # steps whose forward was disturbed (> SLOWED x quiet, > DISTURBED x curve)
    estimated_steps: int = 0            # disturbed steps charged their quiet estimate (the rest: wall time)
    #: Indices into `charges` of the disturbed steps (the ones a level re-charges).
    hits: list[int] = field(default_factory=list)
    #: Per step: (seconds charged, wall seconds, the forward's measured ms, the cost curve's ms or None).
    charges: list[tuple[float, float, float, float | None]] = field(default_factory=list)
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

    @property
    def checked_forwards(self) -> int:
        """Forwards the cost curve could judge: what `disturbed_steps` is out of."""
        return sum(1 for _, _, _, e in self.charges if e)

    @property
    def prefill_disturbed(self) -> bool:
        """Whether the prefill took more than DISTURBED x its quiet estimate (see `quiet_prefill_s`)."""
        return bool(self.prefill_level and self.prefill_expected_ms) and disturbed(
            self.prefill_s * 1e3, self.prefill_level * self.prefill_expected_ms)

    @property
    def quiet_prefill_s(self) -> float:
        """The prefill as measured, or if it was disturbed its quiet estimate: the cost curve's
        prefill time for that many tokens (`CostCurve.prefill`) x the level that quiet races
        measured for this method's prefill against it."""
        if self.prefill_disturbed:
            return self.prefill_level * self.prefill_expected_ms / 1e3
        return self.prefill_s

    def charged_prefill_s(self, shortest_s: float) -> float:
        """The prefill a whole-request figure charges this lane, given the race's shortest:
        its own (`quiet_prefill_s`), at most PREFILL_SPREAD x the shortest (see the module doc)."""
        own = self.quiet_prefill_s
        return min(own, PREFILL_SPREAD * shortest_s) if own > 0 else shortest_s

    def total_tokens_per_s(self, shortest_prefill_s: float) -> float:
        """Tokens per second of the whole request: decoding plus `charged_prefill_s`."""
        total = self.compute_s + self.charged_prefill_s(shortest_prefill_s)
        return self.n_tokens / total if total > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        return {"method": self.method, "tokens": self.n_tokens, "steps": self.steps, "forwards": self.forwards,
                "mat": round(self.mat, 4), "tokens_per_s": round(self.tokens_per_s, 3),
                "compute_s": round(self.compute_s, 4), "wall_compute_s": round(self.wall_compute_s, 4),
                "prefill_s": round(self.prefill_s, 4), "quiet_prefill_s": round(self.quiet_prefill_s, 4),
                "disturbed_steps": self.disturbed_steps,
                "estimated_steps": self.estimated_steps, "done": self.done, "stop_reason": self.stop_reason}


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
                 new_from: int = 0, cost_curve: CostCurve | None = None,
                 levels: QuietLevels | None = None) -> None:
        """`cost_curve` (default: the model's, once measured) tells a disturbed forward; without
        one none is counted and every step is charged its wall time. `levels`: the quiet levels
        to charge disturbed steps by and to add this race's undisturbed forwards to (default: the
        curve's own, `quiet_levels`)."""
        if not drafters:
            raise ValueError("a race needs at least one method")
        self.curve = cost_curve if cost_curve is not None else lm.cost_curve
        self.levels = levels if levels is not None else (quiet_levels(self.curve) if self.curve is not None else None)
        #: This race's undisturbed forwards (measured / predicted), per method: they teach
        #: `levels` at the end if the race was quiet, and stand in for them while none are known.
        self.ratios: dict[str, list[float]] = {}
        #: Per method, the level earlier quiet races taught (`_slowed`'s line), None if none.
        self._learnt: dict[str, float | None] = {}
        base = config or DecodeConfig()
        self.stop_event = stop_event
        self.time_limit_s = time_limit_s
        # One internal event stops every run (an external stop or the race's own time limit).
        self._halt = threading.Event()
        self.stop_reason: str | None = None
        self.lanes: dict[str, Lane] = {}
        # What each lane's prefill feeds: the whole prompt (a new cache; `new_from` only says
        # which positions are new to the drafters).
        self.prefill_tokens = len(input_ids)
        for method, drafter in drafters.items():
            cfg = (configs or {}).get(method, base)
            cfg = dataclasses.replace(cfg, detail=method in detail_for)
            extra = dict((run_kwargs or {}).get(method) or {})
            run = DecodeRun(lm, input_ids, drafter, cfg, stop_event=self._halt, new_from=new_from, **extra)
            self.lanes[method] = Lane(method, run)
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
                try:
                    t = time.perf_counter()
                    rec = next(it)
                    dt = time.perf_counter() - t
                except StopIteration:      # the run's end: its last bookkeeping, no forward
                    dt = time.perf_counter() - t
                    lane.compute_s += dt
                    lane.wall_compute_s += dt
                    self._finish(lane)
                    continue
                # Picture data is the page's work: the drafter times it, DecodeRun reports it apart.
                dt = max(0.0, dt - float(rec.timings.get("picture_ms", 0.0)) / 1e3)
                if lane.steps == 0 and lane.run.prefill_ms is not None:
                    # The first next() ran the prefill too: it is kept apart from the decoding clock.
                    lane.prefill_s = min(dt, lane.run.prefill_ms / 1e3)
                    dt -= lane.prefill_s
                    self._judge_prefill(lane)
                self._charge(lane, rec, dt)
                lane.steps += 1
                lane.forwards += 1 if rec.forwarded else 0
                lane.tokens.extend(rec.committed)
                lane.points.append((lane.compute_s, lane.n_tokens))
                lane.last_info = rec.info
                yield lane, rec
        finally:
            self.wall_s = time.perf_counter() - t0
            checked = sum(ln.checked_forwards for ln in self.lanes.values())
            if self.levels is not None and checked and self.disturbed_steps < LEARN_SHARE * checked:
                for ln in self.lanes.values():
                    if ln.prefill_expected_ms and ln.prefill_s > 0 and not ln.prefill_disturbed:
                        self.ratios[PREFILL + ln.method] = [ln.prefill_s * 1e3 / ln.prefill_expected_ms]
                self.levels.learn(self.ratios)
            for ln in self.lanes.values():
                if not ln.started and not ln.done:
                    ln.stop_reason = ln.stop_reason or self.stop_reason or "not_started"

    def _charge(self, lane: Lane, rec: StepRecord, dt: float) -> None:
        """Add the step's seconds to the lane's clock: its wall time, or for a disturbed forward
        its quiet estimate (see the module doc). The disturbed steps are charged again at every
        step with the level learnt so far, so a lane disturbed before a level was known is
        settled once one is."""
        measured = float(rec.timings.get("forward_ms", 0.0))
        expected = self.curve.t(len(rec.tree), rec.context_len) if self.curve is not None and rec.forwarded else None
        hit = bool(expected) and (disturbed(measured, expected) or self._slowed(lane.method, measured, expected))
        if hit:
            lane.disturbed_steps += 1
        elif expected and measured > 0:
            self.ratios.setdefault(lane.method, []).append(measured / expected)
        lane.charges.append((dt, dt, measured, expected))
        lane.wall_compute_s += dt
        lane.compute_s += dt
        if hit:
            lane.hits.append(len(lane.charges) - 1)
        if lane.hits:
            self._settle(lane)
        for other in self.lanes.values():
            # A lane that finished before any level was known is settled once one is (a quick
            # lane can end while the others have yet to show an undisturbed forward).
            if other.done and other.hits and other.estimated_steps < len(other.hits):
                self._settle(other)

    def _slowed(self, method: str, measured_ms: float, expected_ms: float) -> bool:
        """Whether a forward took more than SLOWED x its quiet estimate. Only a level learnt from
        earlier quiet races judges (the method's own, else every method's pooled): this race's own
        forwards would set the line by the load it is meant to catch."""
        if method not in self._learnt:     # learnt before this race: looked up once
            known = None
            if self.levels is not None:
                known = self.levels.level(method)
                if known is None:
                    known = self.levels.level(method, pooled=True)
            self._learnt[method] = known
        known = self._learnt[method]
        return known is not None and measured_ms > SLOWED * known * expected_ms

    def level(self, method: str) -> float | None:
        """The quiet level a disturbed forward of `method` is charged by: the method's own learnt
        from earlier quiet races, else from this race's undisturbed forwards; failing both, the
        same pooled over every method (the methods' levels differ by up to 15 %); None before
        any forward was measured undisturbed."""
        for pooled in (False, True):
            known = self.levels.level(method, pooled) if self.levels is not None else None
            if known is None:
                known = _median_level(self.ratios, method, QuietLevels.MIN, pooled)
            if known is not None:
                return known
        return None

    def _judge_prefill(self, lane: Lane) -> None:
        """What a lane's prefill is judged by: the curve's time for its tokens, the method's
        prefill level from earlier quiet races."""
        if self.curve is not None and self.prefill_tokens > 0:
            lane.prefill_expected_ms = self.curve.prefill(self.prefill_tokens)
            if self.levels is not None:
                lane.prefill_level = self.levels.level(PREFILL + lane.method)

    def _settle(self, lane: Lane) -> None:
        """Re-charge the lane's disturbed steps with the level known now; the rest stay at wall time."""
        level = self.level(lane.method)
        for i in lane.hits:
            old, dt, f, e = lane.charges[i]
            charged = dt * min(1.0, level * e / f) if level is not None else dt
            lane.charges[i] = (charged, dt, f, e)
            lane.compute_s += charged - old
        lane.estimated_steps = len(lane.hits) if level is not None else 0

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
        """The shortest of the lanes' prefills (the same prompt read by every lane; each as
        measured, or its quiet estimate if it was disturbed), the one least disturbed by other
        work: what the page draws as the shared prefill segment and what bounds the prefill a
        whole-request figure charges each lane (`Lane.charged_prefill_s`)."""
        xs = [ln.quiet_prefill_s for ln in self.lanes.values() if ln.steps]
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
