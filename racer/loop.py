"""The decode loop shared by every method: prefill, then draft -> verify -> commit -> observe.

    run = DecodeRun(lm, input_ids, drafter, DecodeConfig(max_new_tokens=256))
    for step in run:          # one StepRecord per verification step
        ...
    run.result                # DecodeResult: text, token ids, steps, MAT, tokens/s

Invariant after every step: the KV cache holds exactly the prompt plus the committed tokens;
the pending root (the token the last forward fixed) is not in it yet.
"""
from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np
import torch

from .collector import collector_paused
from .costcurve import get_cost_curve
from .cpu.rows import top_k, top_k_leads_with_argmax
from .drafters.base import Drafter, Verified
from .kvcache import new_cache
from .models import LoadedModel
from .records import DecodeResult, StartRecord, StepRecord
from .sizing import Sizer
from .tree import DraftTree
from .verify import Sampling, accept_greedy, accept_sampling, forward_tree, keep_path


@dataclass
class DecodeConfig:
    max_new_tokens: int = 256
    #: Draft tree size including the root, or "auto": sized each step from the measured cost
    #: curve and the learned acceptance (racer.sizing).
    capacity: int | str = "auto"
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = 0
    #: Stop after this many seconds of wall time (None = no limit).
    time_limit_s: float | None = None
    #: Ask drafters for picture data (automaton snapshots, rows used) in every step record.
    detail: bool = False

    def __post_init__(self) -> None:
        # Checked here, so the library and CLI refuse what the app would (a top-p of 0 used to
        # reach torch.multinomial; a negative temperature passed as greedy).
        def whole(name: str, v: Any, lo: int) -> None:
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
                raise ValueError(f"{name} must be a whole number >= {lo}, not {v!r}")

        def real(name: str, v: Any) -> float:
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not math.isfinite(v):
                raise ValueError(f"{name} must be a finite number, not {v!r}")
            return float(v)

        whole("max_new_tokens", self.max_new_tokens, 1)
        if self.capacity != "auto":
            if isinstance(self.capacity, bool) or not isinstance(self.capacity, (int, np.integer)) or self.capacity < 1:
                raise ValueError(f"capacity must be 'auto' or a whole number >= 1, not {self.capacity!r}")
        if real("temperature", self.temperature) < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), not {self.temperature!r}")
        if not 0 < real("top_p", self.top_p) <= 1:
            raise ValueError(f"top_p must be in (0, 1], not {self.top_p!r}")
        whole("top_k", self.top_k, 0)
        if self.seed is not None:
            whole("seed", self.seed, 0)
        if self.time_limit_s is not None and not real("time_limit_s", self.time_limit_s) > 0:
            raise ValueError(f"time_limit_s must be > 0 seconds or None, not {self.time_limit_s!r}")

    @property
    def sampling(self) -> Sampling:
        return Sampling(self.temperature, self.top_p, self.top_k, self.seed)


class _ForwardClock:
    """Times a verify forward. On a CPU, wall time around it. On CUDA, a pair of events on the
    current stream read after the step's one host synchronisation (acceptance reads the argmax
    back), so the host never waits on the device only to time it."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        if self.cuda:
            self._events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        self._t = self._ms = 0.0

    def begin(self) -> None:
        if self.cuda:
            self._events[0].record()
        else:
            self._t = time.perf_counter()

    def end(self) -> None:
        if self.cuda:
            self._events[1].record()
        else:
            self._ms = (time.perf_counter() - self._t) * 1e3

    def ms(self) -> float:
        """Call after the host has read a result of the forward."""
        return self._events[0].elapsed_time(self._events[1]) if self.cuda else self._ms


class DecodeRun:
    """Iterate to decode; `result` is set when iteration ends."""

    def __init__(self, lm: LoadedModel, input_ids: list[int], drafter: Drafter, config: DecodeConfig | None = None,
                 stop_event: threading.Event | None = None, new_from: int = 0,
                 accept: Callable[..., tuple[list[int], int]] | None = None, sizer: Sizer | None = None) -> None:
        self.lm, self.drafter, self.cfg = lm, drafter, config or DecodeConfig()
        self.input_ids = [int(t) for t in input_ids]
        self.new_from = new_from
        self.stop_event = stop_event
        self._accept = accept
        self.result: DecodeResult | None = None
        self.cache: Any = None
        #: The prefill's wall time, set before the first step record is yielded.
        self.prefill_ms: float | None = None
        #: What the drafter was started with (with the step records: a replayable run), set
        #: with `prefill_ms`.
        self.start: StartRecord | None = None
        if not self.input_ids:
            raise ValueError("empty input: nothing to decode from")
        if len(self.input_ids) >= lm.max_context:
            raise ValueError(f"the prompt has {len(self.input_ids)} tokens; this model's context is {lm.max_context}")
        # A session passes its own sizer so acceptance learned in one turn serves the next.
        self.sizer = (sizer or Sizer(get_cost_curve(lm))) if self.cfg.capacity == "auto" else None

    def _sync(self) -> None:
        if self.lm.device.type == "cuda":
            torch.cuda.synchronize(self.lm.device)


    def __iter__(self) -> Iterator[StepRecord]:
        # Each step (the prefill, every draft -> verify -> observe, the end's bookkeeping) runs
        # with the collector held off, so no collection lands inside a forward; it runs between
        # steps instead, and the hold never spans a yield the consumer may abandon.
        steps = self._steps()
        while True:
            with collector_paused():
                rec = next(steps, None)
            if rec is None:
                return
            yield rec

    @torch.inference_mode()
    def _steps(self) -> Iterator[StepRecord]:
        lm, drafter, cfg = self.lm, self.drafter, self.cfg
        model, device = lm.model, lm.device
        sampling = cfg.sampling
        gen = None
        if not sampling.greedy:
            gen = torch.Generator(device=device)
            gen.manual_seed(int(cfg.seed if cfg.seed is not None else torch.seed() % 2**63))
        accept = self._accept
        if accept is None:
            accept = accept_greedy if sampling.greedy else (lambda t, lg: accept_sampling(t, lg, sampling, gen))
        drafter.detail = cfg.detail
        cold = drafter.wants_cold_rows and lm.cold_rows is not None
        if cold:
            drafter.use_cold_rows(lm.cold_rows)
        K = drafter.wants_topk
        want_p = bool(K) and drafter.wants_topk_p

        t_start = time.perf_counter()
        cache = self.cache = new_cache(model)
        context = list(self.input_ids)
        ids = torch.tensor([context], dtype=torch.long, device=device)
        if K and len(context) > self.new_from:
            # Copy-logit drafters want the top-k after every newly fed token, but their table
            # keeps one row per token id, the last occurrence's: only those positions need the
            # vocabulary projection (on a long prompt, about half of them).
            rows = last_occurrences(context, self.new_from)
            if cold:
                # Where the model's cold rows stand in for a token without a row, the prompt's
                # own rows did not pay for their projection: on Spec-Bench (5 per category, 256
                # tokens, bfloat16) racer accepted as many tokens per forward without them (MAT
                # 2.534 against 2.521) and took 1.8 % less time (docs/PERFORMANCE.md §4.1, "The
                # prompt's rows"). The final position's logits are computed anyway.
                final, covered = len(context) - 1 - self.new_from, len(lm.cold_rows)
                rows = [r for r in rows if r == final or context[self.new_from + r] >= covered]
            keep = torch.tensor([self.new_from + i for i in rows], dtype=torch.long, device=device)
            logits = model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=keep).logits[0]
            topk = np.full((len(context) - self.new_from, K), -1, dtype=np.int64)
            topk_p = np.full(topk.shape, -1.0, dtype=np.float32) if want_p else None
            topk[rows], p = top_k(logits, K, want_p)
            if topk_p is not None:
                topk_p[rows] = p
            start = StartRecord(list(context), self.new_from, rows, topk[rows], None if p is None else p, cold)
        else:
            logits = model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1).logits[0]
            topk = topk_p = None
            start = StartRecord(list(context), self.new_from, cold_rows=cold)
        last = logits[-1:]
        # The first token is an acceptance too, at a root-only tree with no root token yet (-1),
        # so an `accept` hook (racer.hf_generate's logits processors) decides it like every other;
        # the default rules draw exactly as before (same argmax, same single multinomial draw).
        root = accept(DraftTree.root_only(-1), last)[1]
        drafter.start(context, self.new_from, topk, topk_p)
        self._sync()
        prefill_ms = self.prefill_ms = (time.perf_counter() - t_start) * 1e3
        self.start = start

        out: list[int] = []
        accept_lengths: list[int] = []
        forwards = 1                     # verification forwards: the prefill fixed the first root
        clock = _ForwardClock(device)
        totals: dict[str, float] = {}
        eos = lm.eos_ids
        stop_reason = "max_new_tokens"
        index = 0
        while True:
            budget = cfg.max_new_tokens - len(out)
            past = len(context)
            if self.stop_event is not None and self.stop_event.is_set():
                stop_reason = "stopped"
                break
            if cfg.time_limit_s is not None and time.perf_counter() - t_start > cfg.time_limit_s:
                stop_reason = "time_limit"
                break
            final = None
            if root in eos:
                final = "eos"
            elif budget <= 1:
                final = "max_new_tokens"
            elif past + 1 >= lm.max_context:
                final = "context_limit"
            if final:
                # The pending root is already fixed: commit it without another forward, and let
                # the drafter see it like any committed token (a chat's next turn follows it).
                only = DraftTree.root_only(root)
                context.append(root)
                extra = drafter.observe(Verified(only, None, [0], [root], -1, context, None))
                rec = StepRecord(index, root, only, [0], [root], None, past,
                                 {"draft_ms": 0.0, "forward_ms": 0.0}, forwarded=False, info=dict(extra or {}))
                out.append(root)
                accept_lengths.append(1)
                stop_reason = final
                yield rec
                break

            t0 = time.perf_counter()
            # Leave a slot for the root the forward will fix, so prompt + output never exceeds the context.
            limit = self.sizer.pool_size if self.sizer else int(cfg.capacity)
            capacity = max(1, min(limit, lm.max_context - past - 1))
            tree = drafter.propose(context, root, capacity)
            ta = time.perf_counter()
            # Picture data (cfg.detail) is the page's work, timed apart from the drafting.
            picture_ms = float(tree.info.get("picture_ms", 0.0))
            if self.sizer is not None:
                tree = self.sizer.size(tree, past)
            t1 = time.perf_counter()
            clock.begin()
            logits = forward_tree(model, cache, tree, past, device, lm.dtype, lm.layout)
            clock.end()
            forwards += 1
            node_topk, node_p = top_k(logits, K, want_p) if K else (None, None)
            if accept is accept_greedy and node_topk is not None and top_k_leads_with_argmax(logits):
                # Each row's top-k starts with its argmax: no second pass over the logits.
                path, next_root = accept_greedy(tree, logits, node_topk[:, 0].tolist())
            else:
                path, next_root = accept(tree, logits)
            t3 = time.perf_counter()
            forward_ms = clock.ms()
            # Commit limits, before anything is kept: stop at an end-of-sequence token or at
            # exactly max_new_tokens. What lies past the cut was never output, so neither the
            # cache nor the drafter may keep it.
            cut, limit_reason = commit_limit([tree.tokens[i] for i in path], eos, budget)
            done = limit_reason is not None
            if done:
                stop_reason = limit_reason
            accepted = path[:cut]
            keep_path(cache, past, accepted, len(tree))
            t4 = time.perf_counter()
            committed = [tree.tokens[i] for i in accepted]
            context.extend(committed)
            extra = drafter.observe(Verified(tree, node_topk, accepted, committed, next_root, context, node_p))
            t5 = time.perf_counter()
            # verify: acceptance and top-k after the forward (on CUDA the wait for the forward too).
            timings = {"draft_ms": max(0.0, (ta - t0) * 1e3 - picture_ms), "forward_ms": forward_ms,
                       "verify_ms": max(0.0, (t3 - t1) * 1e3 - forward_ms),
                       "cache_ms": (t4 - t3) * 1e3, "update_ms": (t5 - t4) * 1e3}
            if picture_ms:
                timings["picture_ms"] = picture_ms
            if self.sizer is not None:
                timings["sizing_ms"] = (t1 - ta) * 1e3
                self.sizer.observe(tree, path, timings, topk_p=node_p)
            for k, v in timings.items():
                totals[k] = totals.get(k, 0.0) + v
            info = dict(tree.info)
            if extra:
                info.update(extra)
            rec = StepRecord(index, root, tree, accepted, committed, None if done else next_root, past, timings, True,
                             info, node_topk, node_p, capacity, path if cut < len(path) else None)
            out.extend(committed)
            accept_lengths.append(len(committed))
            index += 1
            root = next_root
            yield rec
            if done:
                break

        self._sync()
        wall = time.perf_counter() - t_start
        text = lm.tokenizer.decode(out, skip_special_tokens=True)
        self.result = DecodeResult(getattr(drafter, "name", "?"), len(self.input_ids), out, text, len(accept_lengths),
                                   wall, prefill_ms, stop_reason, accept_lengths, totals, forwards)


def commit_limit(committed: list[int], eos: frozenset[int], budget: int) -> tuple[int, str | None]:
    """How many of a step's `committed` tokens the run may output, and why it ends there (None:
    it goes on): up to and including the first end-of-sequence token, at most `budget`."""
    for j, tok in enumerate(committed[:budget]):
        if tok in eos:
            return j + 1, "eos"
    if len(committed) >= budget:
        return budget, "max_new_tokens"
    return len(committed), None


def last_occurrences(context: list[int], new_from: int) -> list[int]:
    """Offsets (from `new_from`, ascending) of the last occurrence of each distinct token in
    `context[new_from:]`; the final position is always one of them."""
    seen: set[int] = set()
    rows = []
    for i in range(len(context) - 1, new_from - 1, -1):
        if context[i] not in seen:
            seen.add(context[i])
            rows.append(i - new_from)
    return rows[::-1]


def decode(lm: LoadedModel, input_ids: list[int], drafter: Drafter, config: DecodeConfig | None = None,
           on_step: Callable[[StepRecord], Any] | None = None, **kwargs: Any) -> DecodeResult:
    """Run to the end; `on_step` sees every step record. The collector stays held off for the
    whole run (racer.collector), `on_step` included."""
    run = DecodeRun(lm, input_ids, drafter, config, **kwargs)
    with collector_paused():
        for rec in run:
            if on_step is not None:
                on_step(rec)
    assert run.result is not None
    return run.result
