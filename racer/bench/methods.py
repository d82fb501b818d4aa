"""What the benchmark runs: every method as a `Conversation` with one call per turn.

* Loop methods (`ar`, `pld`, `tr`, `racer`, its ablations) run through `racer.loop.DecodeRun`.
  A conversation keeps its drafter across its turns, as the app's chat does (drafter state
  belongs to one conversation of one user, DESIGN.md §2.3); each new turn feeds the drafter only the
  tokens it has not seen (`new_from`). Building the drafter is timed as part of turn 1.
* `hf` is `transformers`' own `generate()` (greedy or sampling with the same settings);
  `hf-pld` is its built-in prompt lookup (`prompt_lookup_num_tokens=10`). A streamer that
  only reads the clock records when each step's tokens arrive (it costs one host copy per
  step, which `generate()` already synchronises on), which gives hf-pld's steps and
  accepted lengths too.

Every call is timed the same way: GPU synchronised, clock, the whole call, GPU synchronised,
clock. Token ids are compared like for like: the end-of-sequence token is kept, anything
after it is cut, and no method returns more than `max_new_tokens`.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator

import torch

from ..drafters import METHODS as LOOP_METHODS
from ..drafters import make_drafter
from ..drafters.base import Drafter
from ..costcurve import get_cost_curve
from ..cpu.linear import kernel_of, use_kernel
from ..collector import collector_paused
from ..loop import DecodeConfig, DecodeRun
from ..models import LoadedModel
from ..prompting import common_prefix
from ..sizing import Sizer

#: "-stock": the same generate() with PyTorch's stock linear layers for the call, i.e.
#: transformers as installed, without racer.fastlinear's kernel that every other method runs.
HF_METHODS = ("hf", "hf-pld", "hf-stock", "hf-pld-stock")
ALL_METHODS: tuple[str, ...] = tuple(LOOP_METHODS) + HF_METHODS
#: Per-step phases the decode loop reports (ms), in the order a step runs them.
PHASES = ("draft", "forward", "verify", "cache", "update", "sizing")
PLD_TOKENS = 10


@dataclass
class Outcome:
    """One method's answer to one turn, with its timings."""
    token_ids: list[int]
    wall_s: float
    stop_reason: str
    #: Steps, each committing one or more tokens (= len(accept_lengths)); None when unknown.
    steps: int | None
    #: Tokens committed per step; None when unknown.
    accept_lengths: list[int] | None
    #: Time to the first new token (prefill), ms.
    prefill_ms: float | None
    #: Totals over the steps, ms, keyed like the loop's timings ("forward_ms", ...).
    timings: dict[str, float]
    #: Per-step phase times, ms ({"draft": [...], "forward": [...], ...}); None where not measured.
    step_ms: dict[str, list[float]] | None
    #: Per step: ms since the call began when that step's tokens were ready (tokens-vs-time).
    elapsed_ms: list[float]
    #: Per step: draft tree size verified (root included); None where not applicable.
    tree_sizes: list[int] | None = None
    info: dict[str, Any] = field(default_factory=dict)
    #: Verification forwards, the prefill's included (MAT = tokens / forwards); None when unknown.
    forwards: int | None = None


class Conversation:
    """One conversation of one method: call `run` once per turn, in order."""

    def run(self, input_ids: list[int], cfg: DecodeConfig) -> Outcome:  # pragma: no cover - interface
        raise NotImplementedError


class BenchMethod:
    """A method the benchmark can run. Subclass with `name` and `conversation()`."""
    name: str = "?"

    def conversation(self, lm: LoadedModel) -> Conversation:  # pragma: no cover - interface
        raise NotImplementedError

    def wants_cold_rows(self, lm: LoadedModel) -> bool:
        """Whether its drafter reads the model's cold rows (racer.coldrows)."""
        return False

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


def _sync(lm: LoadedModel) -> None:
    if lm.device.type == "cuda":
        torch.cuda.synchronize(lm.device)


def clip_output(tokens: list[int], eos: frozenset[int] | set[int], max_new_tokens: int) -> list[int]:
    """Keep the first end-of-sequence token, cut what follows, and at most max_new_tokens."""
    out = []
    for t in tokens[:max_new_tokens]:
        out.append(int(t))
        if t in eos:
            break
    return out


def clip_lengths(lengths: list[int], total: int) -> list[int]:
    """Per-step lengths trimmed so they sum to `total` (after `clip_output`)."""
    out, seen = [], 0
    for n in lengths:
        if seen >= total:
            break
        n = min(n, total - seen)
        out.append(n)
        seen += n
    return out


# -- the decode loop's methods -----------------------------------------------------------

class LoopMethod(BenchMethod):
    """A drafter run through the shared decode loop. `factory(lm)` builds a fresh drafter;
    `accept` (optional) replaces the loop's acceptance rule (tests use it to plant a bug)."""

    def __init__(self, name: str, factory: Callable[[LoadedModel], Drafter] | None = None,
                 accept: Callable[..., tuple[list[int], int]] | None = None,
                 capacity: int | str | None = None, drafter: str | None = None,
                 sizer_options: dict[str, Any] | None = None) -> None:
        self.name = name
        drafter = drafter or name
        self.factory = factory or (lambda lm: make_drafter(drafter, vocab_size=lm.vocab_size))
        self.accept = accept
        #: Overrides the run's capacity for this method only ("racer@8": a capacity sweep in one
        #: interleaved run, so every capacity sees the same machine state).
        self.capacity = capacity
        #: Sizer settings for this method only ("racer@auto-nocal": an uncalibrated sizer).
        self.sizer_options = dict(sizer_options or {})

    def conversation(self, lm: LoadedModel) -> Conversation:
        return LoopConversation(self, lm)

    def wants_cold_rows(self, lm: LoadedModel) -> bool:
        try:
            return bool(self.factory(lm).wants_cold_rows)
        except Exception:  # noqa: BLE001 - a drafter that cannot be built fails in its runs, reported there
            return False


class LoopConversation(Conversation):
    def __init__(self, method: LoopMethod, lm: LoadedModel) -> None:
        self.method, self.lm = method, lm
        self.drafter: Drafter | None = None
        self.sizer: Sizer | None = None
        self.fed: list[int] = []          # everything the drafter has seen: earlier prompts + answers

    def _sizer(self, cfg: DecodeConfig) -> Sizer | None:
        """With capacity "auto", one sizer per conversation, so what it learns in turn 1 serves turn 2."""
        if cfg.capacity != "auto":
            return None
        if self.sizer is None:
            self.sizer = Sizer(get_cost_curve(self.lm), **self.method.sizer_options)
        return self.sizer

    def run(self, input_ids: list[int], cfg: DecodeConfig) -> Outcome:
        lm = self.lm
        kwargs: dict[str, Any] = {}
        if self.method.accept is not None:
            kwargs["accept"] = self.method.accept
        _sync(lm)
        t0 = time.perf_counter()
        if self.drafter is None:
            self.drafter = self.method.factory(lm)
        if self.method.capacity is not None:
            cfg = replace(cfg, capacity=self.method.capacity)
        sizer = self._sizer(cfg)
        if sizer is not None:
            kwargs["sizer"] = sizer
        new_from = common_prefix(self.fed, input_ids)
        run = DecodeRun(lm, input_ids, self.drafter, cfg, new_from=new_from, **kwargs)
        step_ms: dict[str, list[float]] = {p: [] for p in PHASES}
        elapsed: list[float] = []
        sizes: list[int] = []
        # Every method's timed run holds the collector off alike (racer.collector), generate() too.
        with collector_paused():
            for rec in run:
                elapsed.append((time.perf_counter() - t0) * 1e3)
                for p in PHASES:
                    step_ms[p].append(float(rec.timings.get(p + "_ms", 0.0)))
                sizes.append(len(rec.tree) if rec.forwarded else 0)
            _sync(lm)
            wall = time.perf_counter() - t0
        res = run.result
        assert res is not None
        self.fed = list(input_ids) + list(res.token_ids)
        step_ms = {p: v for p, v in step_ms.items() if any(v) or p in ("draft", "forward", "update")}
        return Outcome(list(res.token_ids), wall, res.stop_reason, res.steps, list(res.accept_lengths),
                       res.prefill_ms, dict(res.timings), step_ms, elapsed, sizes,
                       {"new_from": new_from, "loop_wall_s": res.wall_s}, forwards=res.forwards)


# -- transformers' own decoders --------------------------------------------------------------

class _StepClock:
    """A generate() streamer that records when each step's tokens arrive (the first put is the prompt)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.counts: list[int] = []
        self._prompt = True

    def put(self, value: torch.Tensor) -> None:
        if self._prompt:
            self._prompt = False
            return
        self.times.append(time.perf_counter())
        self.counts.append(int(value.numel()))

    def end(self) -> None:
        pass


@contextlib.contextmanager
def _eos_override(model: Any, eos: list[int] | None) -> Iterator[None]:
    """generate() fills an unset eos from the model's generation config; make it stop exactly
    where the decode loop stops (at `lm.eos_ids`, or nowhere when that is empty)."""
    gc = model.generation_config
    old = gc.eos_token_id
    gc.eos_token_id = eos
    try:
        yield
    finally:
        gc.eos_token_id = old


@contextlib.contextmanager
def _kernel(model: Any, stock: bool) -> Iterator[None]:
    """Run the block on PyTorch's stock linear layers when `stock` (keeping the packed copies,
    so switching back costs nothing), then restore the model's kernel."""
    before = kernel_of(model)
    if not stock or before == "stock":
        yield
        return
    use_kernel(model, "stock", keep_packed=True)
    try:
        yield
    finally:
        use_kernel(model, before)


class HFMethod(BenchMethod):
    """transformers' generate(): plain (`hf`) or with its prompt lookup (`hf-pld`)."""

    def __init__(self, name: str = "hf", prompt_lookup: int | None = None, stock_kernel: bool = False) -> None:
        self.name = name
        self.prompt_lookup = prompt_lookup
        self.stock_kernel = stock_kernel

    def conversation(self, lm: LoadedModel) -> Conversation:
        return HFConversation(self, lm)


class HFConversation(Conversation):
    def __init__(self, method: HFMethod, lm: LoadedModel) -> None:
        self.method, self.lm = method, lm

    def generate_kwargs(self, cfg: DecodeConfig) -> dict[str, Any]:
        s = cfg.sampling
        eos = sorted(self.lm.eos_ids)
        kw: dict[str, Any] = {"max_new_tokens": int(cfg.max_new_tokens), "num_beams": 1, "use_cache": True,
                              "pad_token_id": eos[0] if eos else 0}
        if s.greedy:
            # The library defaults (not the model's sampling hints), so nothing is flagged as unused.
            kw.update(do_sample=False, temperature=1.0, top_p=1.0, top_k=50)
        else:
            # top_k passed explicitly: generate() would otherwise default to 50; 0 = off, as in the loop.
            kw.update(do_sample=True, temperature=float(s.temperature), top_p=float(s.top_p), top_k=int(s.top_k or 0))
        if self.method.prompt_lookup:
            kw["prompt_lookup_num_tokens"] = int(self.method.prompt_lookup)
        return kw

    def run(self, input_ids: list[int], cfg: DecodeConfig) -> Outcome:
        lm = self.lm
        kw = self.generate_kwargs(cfg)
        eos = sorted(lm.eos_ids) or None
        clock = _StepClock()
        with torch.inference_mode(), _eos_override(lm.model, eos), _kernel(lm.model, self.method.stock_kernel), \
                collector_paused():
            ids = torch.tensor([input_ids], dtype=torch.long, device=lm.device)
            mask = torch.ones_like(ids)
            if not cfg.sampling.greedy:
                seed = int(cfg.seed if cfg.seed is not None else 0)
                torch.manual_seed(seed)
                if lm.device.type == "cuda":
                    torch.cuda.manual_seed_all(seed)
            _sync(lm)
            t0 = time.perf_counter()
            out = lm.model.generate(ids, attention_mask=mask, streamer=clock, **kw)
            new = out[0, len(input_ids):].tolist()
            _sync(lm)
            wall = time.perf_counter() - t0
        tokens = clip_output(new, lm.eos_ids, cfg.max_new_tokens)
        lengths = clip_lengths(clock.counts, len(tokens))
        times = clock.times[: len(lengths)]
        elapsed = [(t - t0) * 1e3 for t in times]
        prefill = elapsed[0] if elapsed else wall * 1e3
        if tokens and tokens[-1] in lm.eos_ids:
            stop = "eos"
        elif len(tokens) >= cfg.max_new_tokens:
            stop = "max_new_tokens"
        else:
            stop = "other"
        if len(new) > len(tokens):
            stop += f" (cut {len(new) - len(tokens)} tokens after it)"
        timings = {"generate_ms": max(0.0, wall * 1e3 - prefill)}
        ok = sum(lengths) == len(tokens)
        # generate() streams once per forward, the prefill's first token included.
        return Outcome(tokens, wall, stop, len(lengths) if ok else None, lengths if ok else None, prefill, timings,
                       None, elapsed, None, {"prompt_lookup": self.method.prompt_lookup},
                       forwards=len(lengths) if ok else None)


SIZER_VARIANTS: dict[str, dict[str, Any]] = {"auto-cal": {"calibrate": True}, "auto-nocal": {"calibrate": False},
                                              "auto-norun": {"match_run": False}, "auto-noconf": {"confidence": False},
                                              # Trees up to 64 nodes from a pool of 128 (before
                                              # racer.sizing.largest_tree capped them by the curve).
                                              "auto-cap64": {"max_size": 64},
                                              # Every size at the curve's measured cost (before
                                              # racer.sizing.first_pass_priced).
                                              "auto-measured": {"first_pass": 0}}


def get_method(spec: str | BenchMethod) -> BenchMethod:
    """A BenchMethod from a name (`ar`, ..., `racer-logits`, `hf`, `hf-pld`) or as is. A loop
    method may fix its own capacity: `racer@8`, `tr@auto`, and its sizer's calibration:
    `racer@auto-cal`, `racer@auto-nocal` (an A/B of `Sizer(calibrate=...)` in one run), and
    `racer@auto-norun` (`Sizer(match_run=False)`), `racer@auto-noconf` (`Sizer(confidence=False)`),
    `racer@auto-cap64` (`Sizer(max_size=64)`), `racer@auto-measured` (`Sizer(first_pass=0)`)."""
    if isinstance(spec, BenchMethod):
        return spec
    if "@" in spec:
        base, _, cap = spec.partition("@")
        if base not in LOOP_METHODS:
            raise ValueError(f"{spec!r}: only decode-loop methods take a capacity ({', '.join(LOOP_METHODS)})")
        if cap in SIZER_VARIANTS:
            return LoopMethod(spec, capacity="auto", drafter=base, sizer_options=SIZER_VARIANTS[cap])
        if cap != "auto" and not (cap.isdigit() and int(cap) >= 1):
            raise ValueError(f"{spec!r}: the capacity after '@' must be 'auto', "
                             f"{', '.join(SIZER_VARIANTS)} or a whole number >= 1")
        return LoopMethod(spec, capacity=cap if cap == "auto" else int(cap), drafter=base)
    if spec in HF_METHODS:
        return HFMethod(spec, prompt_lookup=PLD_TOKENS if "pld" in spec else None, stock_kernel=spec.endswith("-stock"))
    if spec in LOOP_METHODS:
        return LoopMethod(spec)
    raise ValueError(f"unknown method {spec!r}; known: {', '.join(ALL_METHODS)}")
