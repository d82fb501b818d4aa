"""Event handlers of the app: validation, the race stream, the inspector, chat, benchmark and
explainer. `app.py` only lays out components and wires them to these methods.

Rules every handler follows:
* per-session data lives in the `Session` passed in (a gr.State), never in module globals;
* decodes run under the "decode" concurrency group (one at a time on a CPU), and every model
  computation runs on a decode slot's thread (`self.slots`, racer_app.decodethreads), never on
  the handler's; inspector, stop and status handlers are pure/light and run in their own
  unlimited group;
* user mistakes give a clear message (status markdown + gr.Warning), never an exception;
  an unexpected error is logged and reported, and the server keeps going.
"""
from __future__ import annotations

import functools
import gc
import json
import logging
import os
import re
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Generator, Iterator

import gradio as gr
from gradio.components.plot import PlotData

from racer import DecodeConfig, DecodeRun, ModelLoadError, build_input_ids, make_drafter
from racer.coldrows import get_cold_rows
from racer.models import resolve_device, resolve_dtype
from racer.prompting import common_prefix
from racer.race import Race
from racer.records import run_numbers
from racer.replay import Turn
from visuals import acceptance_by_source, cost_figure
from visuals.race_figure import race_figure_spec
from visuals.bench_figures import bench_figures

from . import explainer as X
from . import tracefile
from .format import (METHOD_TITLES, md_text, SpanBuilder, find_cost_curve, lane_stats_md, race_plot_data, race_record,
                     numbers_md, series_md, sizing_md, step_sentence, trace_header_md, verdict_md)
from .decodethreads import DecodeSlots
from .desk import Desk
from .inspector import clamp_step, empty_figure, fig_width, fluid, fluid_spec, render_step, step_of_span
from .jobs import Job
from .models import ModelStore
from .session import Session, Trace, bound_detail
from .trace_views import TraceViews
from .anatomy_text import stage_md
from .anatomy_view import step_anatomy
from .stage_render import render_stage
from .settings import (FIELDS, Limits, Settings, capacity_value, clamp_count, cost_curve_figure_data,
                       default_settings, make_sizer, racer_options, settings_from_values, uses_auto, validate)

log = logging.getLogger("racer_app")

RACE_METHODS = ("racer", "ar", "tr")
RACE_REPEATS = 3        # the page's "race 3×" switch
TEXT_EVERY_S = 0.1      # race text updates: ~10 per second
PLOT_EVERY_S = 0.33     # race plot updates: ~3 per second
#: The start-up's quiet race (`Studio._quiet_race`): a copy-heavy example that runs long enough
#: for every lane's level (racer.race.QuietLevels.MIN forwards; on the default model RACER makes
#: 33 here in bfloat16 for 106 tokens, 39 in float32 for 79), about 3 s on a 2-core CPU.
#: "Extract to JSON" was the example before; in bfloat16 it now stops after 41 tokens.
QUIET_RACE_EXAMPLE = "Summarise a passage"
QUIET_RACE_TOKENS = 128


PLOT_WIDTH = 640       # charts that stretch to their container: legends are laid out for this width


def _decode_one(tok: Any, t: int) -> str:
    return tok.decode([int(t)], skip_special_tokens=False)


def _decode_many(tok: Any, ids: list[int]) -> str:
    return tok.decode([int(t) for t in ids], skip_special_tokens=True)


def race_plot(race: Race, viewport: Any = None) -> PlotData:
    """The race's plot as gr.Plot takes it, built as plain JSON: a live race sends one several
    times a second, and plotly's validated figure objects cost 35-50 ms each on the server's
    cores (visuals.race_figure.race_figure_spec)."""
    spec = race_figure_spec(race_plot_data(race.lanes), width=PLOT_WIDTH, prefill_s=race.shared_prefill_s)
    return PlotData(type="plotly", plot=json.dumps(fluid_spec(spec, viewport)))


def race_span_builders(lm: Any) -> dict[str, SpanBuilder]:
    """One text builder per race lane (plain decoding's uncoloured)."""
    dm = functools.partial(_decode_many, lm.tokenizer)
    return {m: SpanBuilder(dm, colored=(m != "ar")) for m in RACE_METHODS}


def _decode_many_raw(tok: Any, ids: list[int]) -> str:
    return tok.decode([int(t) for t in ids], skip_special_tokens=False)


class UserError(ValueError):
    """A problem with the request that the user can fix; the message says how."""


#: C0/C1 control characters other than tab, newline and carriage return.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
#: Characters a prompt may have per token it may have (a generous bound, checked before
#: tokenising so that a megabyte of text is refused at once rather than tokenised first).
CHARS_PER_TOKEN = 32


def clean_text(text: Any, what: str, max_chars: int, notes: list[str]) -> str:
    """User text made safe to tokenise: lone surrogates (invalid Unicode) become U+FFFD,
    control characters other than tab/newline are dropped (each with a note), and text far
    beyond the prompt limit is refused before any tokenising."""
    if text is None:
        return ""
    if not isinstance(text, str):
        raise UserError(f"The {what} must be text.")
    if len(text) > max_chars:
        raise UserError(f"The {what} is {len(text):,} characters long; this server takes prompts of up to "
                        f"{max_chars // CHARS_PER_TOKEN:,} tokens. Please shorten it.")
    fixed = text.encode("utf-8", "replace").decode("utf-8") if any(0xD800 <= ord(c) <= 0xDFFF for c in text) \
        else text
    if fixed != text:
        notes.append(f"invalid Unicode in the {what} replaced by '?'")
    cleaned, n = _CONTROL.subn("", fixed)
    if n:
        notes.append(f"{n} control character{'s' if n > 1 else ''} removed from the {what}")
    return cleaned


def is_oom(e: BaseException) -> bool:
    """Out of memory on the accelerator (or a CPU allocation failure)."""
    import torch
    if isinstance(e, (torch.cuda.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(e, RuntimeError) and "out of memory" in str(e).lower()


def release_memory(e: BaseException | None = None) -> None:
    """After a failed decode: drop the frames that still hold its KV cache and give the
    accelerator's cached blocks back, so the next request starts from a clean slate."""
    if e is not None and e.__traceback__ is not None:
        traceback.clear_frames(e.__traceback__)
    gc.collect()
    import torch
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def fault_message(e: BaseException, lm: Any = None) -> str:
    if is_oom(e):
        where = f"the {lm.device}" if lm is not None else "the device"
        return (f"❌ Out of memory on {where}. The request was stopped and its memory released; the model is "
                f"still loaded. Try a shorter prompt, fewer new tokens or a smaller tree.")
    return f"❌ Something went wrong: {e.__class__.__name__}: {e}. The app is fine; try again or change the settings."


class Studio:
    """Handlers bound to one model store and one set of server limits."""

    def __init__(self, store: ModelStore, limits: Limits | None = None) -> None:
        self.store = store
        lm = store.peek()
        if lm is not None:
            dev, dt = lm.device, lm.dtype
        else:
            try:
                dev = resolve_device(os.environ.get("RACER_DEVICE", "auto"))
                dt = resolve_dtype(os.environ.get("RACER_DTYPE", "auto"), dev)
            except Exception:  # noqa: BLE001
                import torch
                dev, dt = torch.device("cpu"), torch.float32
        self.limits = limits or Limits.for_device(dev.type)
        self.defaults: Settings = default_settings(dev.type, str(dt).replace("torch.", ""))
        self.defaults.automaton_capacity = min(self.defaults.automaton_capacity, self.limits.max_automaton)
        self._preset_lock = threading.Lock()
        self.warming: str | None = None
        # Admission, Stop, queue position, the end of sessions and the benchmark folders.
        self.desk = Desk(self.limits)
        # The decode slot, held by every decode and by work no visitor asked for (the warm-up's
        # cost-curve measurement and preset run): none of it runs beside a race to skew its clock.
        # Each slot is a thread, and every model computation runs on it (racer_app.decodethreads:
        # forwards from several threads ran at half speed on a 2-core CPU).
        self.slots = DecodeSlots(self.limits.decode_concurrency)
        # Repeating a race is cheap on a GPU; on a CPU one race takes a while.
        self.repeat_default = dev.type == "cuda"
        # The inspector's anatomy, what-if and trace-file views.
        self.traces = TraceViews(self)

    def _in_slot(self, waiting: Any, work: Iterator[tuple]) -> Iterator[tuple]:
        """Step the generator `work` on a decode slot's thread, holding the slot; `waiting(status)`
        is the frame shown while the server's own warm-up holds it."""
        yield from self.slots.iterate(work, waiting=lambda: waiting(
            "⏳ Waiting for the server's warm-up (the model's load, cost-curve measurement, example run and a "
            "short timing race) to finish, so it does not run beside yours…"))

    @property
    def max_session_bytes(self) -> int:
        return int(self.limits.session_mb * 2**20)

    @property
    def max_chars(self) -> int:
        return self.limits.max_prompt_tokens * CHARS_PER_TOKEN

    # -- shared helpers --------------------------------------------------------------------------

    def _settings(self, vals: tuple[Any, ...]) -> tuple[Settings, list[str]]:
        return validate(settings_from_values(vals), self.limits, self.store.allowed, self.defaults)

    def _model(self, s: Settings) -> Any:
        try:
            return self.store.get(s.model, timeout=900)
        except ModelLoadError as e:
            raise UserError(str(e)) from e

    def _prompt_ids(self, lm: Any, prompt: Any, system: str | None) -> list[int]:
        ids = build_input_ids(lm.tokenizer, prompt, system=(system or None))
        if len(ids) > self.limits.max_prompt_tokens:
            raise UserError(f"The prompt is {len(ids)} tokens long; this server takes up to "
                            f"{self.limits.max_prompt_tokens}. Please shorten it.")
        if len(ids) + 2 >= lm.max_context:
            raise UserError(f"The prompt is {len(ids)} tokens; the model's context is {lm.max_context}.")
        return ids

    def _config(self, lm: Any, s: Settings, n_prompt: int, notes: list[str]) -> DecodeConfig:
        room = lm.max_context - n_prompt - 2
        max_new = s.max_new_tokens
        if max_new > room:
            notes.append(f"max new tokens lowered to {room} to fit the model's context of {lm.max_context}")
            max_new = room
        return DecodeConfig(max_new_tokens=max_new, capacity=capacity_value(s), temperature=s.temperature,
                            top_p=s.top_p, seed=s.seed, time_limit_s=self.limits.time_limit_s)

    @staticmethod
    def _notes_md(notes: list[str]) -> str:
        return ("Adjusted: " + "; ".join(notes) + ".") if notes else ""

    def _sizer_kwargs(self, lm: Any, s: Settings, methods: tuple[str, ...]) -> dict[str, dict[str, Any]]:
        """With capacity auto, a fresh sizer per drafting method (same hardware curve)."""
        if not uses_auto(s):
            return {}
        return {m: {"sizer": make_sizer(lm)} for m in methods if m != "ar"}

    def trace_from(self, lm: Any, steps: list[Any], prompt_ids: list[int], source: str, title: str,
                   s: Settings, stop_reason: str | None, turns: list[Turn] | None = None,
                   sizer: Any = None) -> Trace:
        """The inspector's trace of a RACER run; with `turns` (the drafter's decodes, this one
        last) and the run's `sizer`, it replays (anatomy, what if) without the model."""
        detail = bound_detail(steps, self.limits.inspector_steps)
        tok = lm.tokenizer
        # Whether a turn's drafter had the model's cold rows is in its start record; once a
        # model has them it keeps them, so these are the ones it had.
        cold = lm.cold_rows
        return Trace(steps, list(prompt_ids), functools.partial(_decode_one, tok), functools.partial(_decode_many, tok),
                     source=source, title=title, model=lm.name, settings=s.to_dict(), detail_steps=detail,
                     stop_reason=stop_reason, cost_curve=sizer.curve if sizer is not None else lm.cost_curve,
                     turns=turns, drafter={"method": "racer", "options": racer_options(s), "vocab_size": lm.vocab_size,
                                           "cold_rows": cold.key if cold is not None else None},
                     sizer=dict(sizer.settings) if sizer is not None else None, cold_rows=cold)

    # -- status ---------------------------------------------------------------------------------

    def model_status(self) -> tuple[str, Any]:
        """Header status line (plain words first; file names and kernels behind "details"); the
        second value turns the polling timer off once settled."""
        st = self.store.status()
        if st["state"] == "ready":
            name = friendly_model_name(st["model"])
            where = "a GPU" if str(st["device"]).startswith("cuda") else "the CPU"
            md = f"🟢 **{name}** is ready on {where} · loaded in {st['load_s']:.1f} s"
            if self.warming:
                md += f" · ⏳ {self.warming}…"
            details = [f"model file: {st['model']}", f"device {st['device']}, {st['dtype']} arithmetic",
                       f"context {st.get('max_context', '?')} tokens"] + list(st.get("notes") or [])
            md += ("\n<details class='racer-details'><summary>technical details</summary>\n\n"
                   + "\n".join(f"- {md_text(str(x))}" for x in details) + "\n</details>")
            return md, gr.Timer(active=bool(self.warming))
        if st["state"] == "error":
            return (f"🔴 The model could not be loaded: {st['error']}. The **Step inspector** and **How it works** "
                    f"still replay the example traces that ship with the app."), gr.Timer(active=False)
        return (f"⏳ Loading the model ({st['spec']}) — {st['elapsed_s']:.0f} s; the first start converts it "
                f"once (about 15 s), later starts take a second. Meanwhile the Step inspector shows an example "
                f"trace."), gr.Timer(active=True)

    def prompt_mode(self, model: str | None = None) -> str:
        """The note beside the prompt: whether the chosen model answers through its chat template or,
        as a base model, continues the text (plain completion)."""
        from racer.models import SHIPPED
        spec = model or "default"
        lm = self.store.peek(spec)
        shipped = SHIPPED.get(spec)
        chat = lm.chat if lm is not None else (shipped.chat if shipped else True)
        title = shipped.title.split(" (")[0] if shipped else (lm.name if lm is not None else spec)
        if chat:
            return f"💬 **{title}** is a chat model: the prompt (and system prompt) go through its chat template."
        return (f"📝 **{title}** is a base model: **plain completion**. It continues your text rather than answering "
                f"it (a system prompt goes before the text, a blank line between), so start a passage or a function "
                f"for it to finish: the completion examples below are written that way.")

    def settings_info(self) -> str:
        lm = self.store.peek()
        lim = self.limits
        dev = f"**{lm.device}** · **{str(lm.dtype).replace('torch.', '')}** · context {lm.max_context} tokens" \
            if lm is not None else "(model loading)"
        return (f"Device and dtype: {dev}.  \nServer limits: up to **{lim.max_new_tokens}** new tokens, prompts up "
                f"to **{lim.max_prompt_tokens}** tokens, **{lim.time_limit_s:.0f} s** per request "
                f"({lim.bench_time_limit_s:.0f} s for a benchmark or a race 3×, and {lim.bench_max_runs} prompt × "
                f"method runs per benchmark), "
                f"{lim.decode_concurrency} decode{'s' if lim.decode_concurrency > 1 else ''} at a time "
                f"(others wait in the queue; one waiting or running decode per visitor), automata of up to "
                f"{lim.max_automaton:,} nodes, pictures for the first {lim.inspector_steps} steps of a run."
                "\n<details class='racer-details'><summary>for whoever runs this server</summary>\n\n"
                "These limits, the start-up model and the models visitors may pick beside the shipped ones are set "
                "by environment variables (`RACER_MODEL`, `RACER_ALLOWED_MODELS`, `RACER_MAX_NEW_TOKENS`, …): "
                "docs/RELIABILITY.md lists them.\n</details>")

    # -- race ----------------------------------------------------------------------------------

    def _race_frame(self, status: Any = None, lanes: dict[str, Any] | None = None, spans: dict[str, Any] | None = None,
                    plot: Any = None, verdict: Any = None, running: bool | None = None, sess: Any = None,
                    clear: bool = False, series: list[dict[str, Any]] | None = None) -> tuple:
        skip = gr.skip()
        out: list[Any] = [skip if status is None else status]
        for m in RACE_METHODS:
            if clear:
                out += ["", []]
            elif lanes is not None and m in lanes:
                out += [lane_stats_md(lanes[m], running=bool(running), series=series),
                        spans[m] if spans and m in spans else skip]
            else:
                out += [skip, skip]
        out.append(skip if plot is None else gr.Plot(value=plot, visible=True))
        out.append(skip if verdict is None else verdict)
        if running is None:
            out += [skip, skip]
        else:
            out += [gr.Button(interactive=not running), gr.Button(interactive=running)]
        out.append(skip if sess is None else sess)
        return tuple(out)

    def race(self, sess: Session | None, viewport: Any, prompt: str, system: str, *vals: Any) -> Iterator[tuple]:
        """Stream a fair three-way race (see racer.race). `vals` are the Settings values, then
        optionally the page's "race 3×" switch: the race repeated, with medians and ranges."""
        sess = sess if isinstance(sess, Session) else Session()
        repeats = RACE_REPEATS if len(vals) > len(FIELDS) and vals[len(FIELDS)] is True else 1
        vals = vals[:len(FIELDS)]
        job = sess.begin("race")
        try:
            if job.stop.is_set():     # Stop was pressed while it waited in the queue
                yield self._race_frame(status="⏹ Stopped before it started.", running=False, sess=sess)
                return
            yield self._race_frame(status="Preparing the race…", clear=True, verdict="", running=True)
            yield from self._in_slot(lambda status: self._race_frame(status=status),
                                     self._race(sess, job, prompt, system, vals, viewport, repeats))
        except UserError as e:
            gr.Warning(str(e))
            yield self._race_frame(status=f"⚠️ {e}", running=False, sess=sess)
        except Exception as e:  # noqa: BLE001 - one failed request must not take the app down
            log.error("race failed: %s", traceback.format_exc())
            msg = fault_message(e, self.store.peek())
            release_memory(e)
            yield self._race_frame(status=msg, running=False, sess=sess)
        finally:
            sess.end(job)
            self.desk.decode_ended()

    def _race(self, sess: Session, job: Job, prompt: str, system: str, vals: tuple[Any, ...],
              viewport: Any = None, repeats: int = 1) -> Iterator[tuple]:
        notes: list[str] = []
        prompt = clean_text(prompt, "prompt", self.max_chars, notes)
        system = clean_text(system, "system prompt", self.max_chars, notes)
        if not prompt.strip():
            raise UserError("Please type a prompt (or pick an example) first.")
        s, more = self._settings(vals)
        notes += more
        if self.store.loading:
            yield self._race_frame(status="⏳ Waiting for the model to finish loading…")
        lm = self._model(s)
        ids = self._prompt_ids(lm, prompt, system)
        cfg = self._config(lm, s, len(ids), notes)
        if uses_auto(s) and lm.cost_curve is None:
            yield self._race_frame(status="⏳ Measuring this machine's cost curve (once per machine; up to a minute "
                                          "on a small CPU)…")
        head = (f"Racing on **{friendly_model_name(lm.name)}** ({lm.device}, {str(lm.dtype).replace('torch.', '')}) · prompt "
                f"{len(ids)} tokens · up to {cfg.max_new_tokens} new tokens · tree "
                f"{'auto' if cfg.capacity == 'auto' else str(cfg.capacity) + ' nodes'} · "
                f"{'greedy' if cfg.temperature <= 0 else f'sampling T={cfg.temperature:g}, top-p {cfg.top_p:g}'}")
        note = self._notes_md(notes)
        if notes:
            gr.Info(note)
        # A series is bounded like a benchmark request, each race in it like a race; each race is
        # built afresh (new drafters, new sizers, new caches) so none starts with what an earlier
        # one learnt.
        limit_s = self.limits.time_limit_s if repeats == 1 else max(self.limits.time_limit_s,
                                                                    self.limits.bench_time_limit_s)
        deadline = time.perf_counter() + limit_s
        series: list[dict[str, Any]] = []
        for i in range(repeats):
            label = f"Race {i + 1} of {repeats} · " if repeats > 1 else ""
            left = deadline - time.perf_counter()
            race = Race(lm, ids, self._race_drafters(lm, s), cfg, detail_for=("racer",), stop_event=job.stop,
                        time_limit_s=max(0.0, min(left, self.limits.time_limit_s)),
                        run_kwargs=self._sizer_kwargs(lm, s, RACE_METHODS))
            status = label + head + (f"  \n{note}" if note else "") + "  \nStop ends it at the next step."
            out = yield from self._race_stream(race, lm, status, viewport)
            if race.stop_reason:        # a race cut short does not count in the series
                break
            series.append(race_record(race.lanes, race.shared_prefill_s))
            if i + 1 < repeats:
                del race, out     # this race's caches go before the next one allocates its own
        racer_steps, tr_steps, builders = out
        cmp = race.compare()
        sess.race_summary = race.summary()
        if len(series) > 1:
            sess.race_summary["series"] = series
        rl = race.lanes["racer"]
        turns = [Turn(rl.run.start, racer_steps)] if rl.run.start is not None else None
        sess.trace = self.trace_from(lm, racer_steps, ids, "race", prompt.strip().splitlines()[0], s, rl.stop_reason,
                                     turns, rl.run.sizer)
        notes += sess.fit(self.max_session_bytes)
        note = self._notes_md(notes)
        chosen = "  \n".join(x for x in (sizing_md(racer_steps, "RACER"), sizing_md(tr_steps, "Token Recycling")) if x)
        verdict = verdict_md(race.lanes, cmp, cfg.temperature <= 0, functools.partial(_decode_many_raw, lm.tokenizer),
                             race.stop_reason, chosen, prefill_s=race.shared_prefill_s)
        if repeats > 1 and series:
            verdict = series_md(series, repeats) + "\n\n**The last race:** " + verdict
        done = {"stopped": "⏹ Stopped.", "time_limit": f"⏱ Time limit ({limit_s:.0f} s) reached."
                }.get(race.stop_reason or "", "🏁 Finished.")
        if repeats > 1:
            done = (f"🏁 Finished {repeats} of {repeats} races." if not race.stop_reason else
                    f"{done[:-1]} during race {len(series) + 1} of {repeats}.")
        yield self._race_frame(status=f"{done} {head}" + (f"  \n{note}" if note else "") +
                               "  \nOpen **Step inspector** to replay RACER's steps.",
                               lanes=race.lanes, spans={m: list(builders[m].spans) for m in RACE_METHODS},
                               plot=race_plot(race, viewport),
                               verdict=verdict, running=False, sess=sess, series=series if repeats > 1 else None)

    @staticmethod
    def _race_drafters(lm: Any, s: Settings) -> dict[str, Any]:
        return {"racer": make_drafter("racer", vocab_size=lm.vocab_size, **racer_options(s)),
                "ar": make_drafter("ar", vocab_size=lm.vocab_size),
                "tr": make_drafter("tr", vocab_size=lm.vocab_size)}

    def _race_stream(self, race: Race, lm: Any, status: str,
                     viewport: Any) -> Generator[tuple, None, tuple[list[Any], list[Any], dict[str, SpanBuilder]]]:
        """Run one race, streaming frames; returns RACER's and TR's step records and the text builders.
        Only the steps are timed (inside `Race`): building and sending these frames is not."""
        builders = race_span_builders(lm)
        racer_steps: list[Any] = []
        tr_steps: list[Any] = []
        yield self._race_frame(status=status, lanes=race.lanes, spans={m: [] for m in RACE_METHODS}, running=True)
        last_text = last_plot = 0.0
        dirty: set[str] = set()
        for lane, rec in race:
            builders[lane.method].push_step(rec)
            dirty.add(lane.method)
            if lane.method == "racer":
                racer_steps.append(rec)
            elif lane.method == "tr":
                tr_steps.append(rec)
            now = time.perf_counter()
            if now - last_text >= TEXT_EVERY_S:
                plot = None
                if now - last_plot >= PLOT_EVERY_S:
                    plot = race_plot(race, viewport)
                    last_plot = now
                spans = {m: list(builders[m].spans) for m in dirty}
                dirty.clear()
                last_text = now
                yield self._race_frame(lanes=race.lanes, spans=spans, plot=plot, running=True)
        return racer_steps, tr_steps, builders

    async def stop(self, sess: Session | None, request: gr.Request) -> tuple:
        """Outputs: status, the view's go button, its Stop button (see Desk.stop)."""
        return await self.desk.stop(sess, request)

    # -- inspector (pure functions of the session's trace) ---------------------------------------------

    def inspector_refresh(self, sess: Session | None, viewport: Any = None) -> tuple:
        """Header, slider range and step 1 of the session's latest trace. A session with no run
        of its own gets the first shipped example trace, so the inspector teaches before any
        decode (and on a server whose model could not be loaded at all)."""
        trace = sess.trace if isinstance(sess, Session) else None
        note = ""
        if (trace is None or trace.n == 0) and isinstance(sess, Session):
            trace = self.example_trace()
            if trace is not None:
                sess.trace = trace
                note = "No run of yours yet, so here is an example"
                if self.store.status().get("state") == "error":
                    note = ("⚠️ No model could be loaded on this server, so the race and the chat are off. Here is an "
                            "example trace instead")
                note += (": it replays a recorded run, anatomy and what-if included. Run a race to inspect your own, "
                         "or pick another example under *Traces*.")
        if trace is None or trace.n == 0:
            msg = "No RACER run yet in this session: run a race (or chat below), then step through it here."
            return (msg, gr.Slider(minimum=1, maximum=2, value=1, interactive=False)) + self._empty_step(msg)
        return ((trace_header_md(trace, note), gr.Slider(minimum=1, maximum=max(2, trace.n), value=1, step=1,
                                                         interactive=trace.n > 1))
                + self._step_outputs(trace, 0, viewport))

    @staticmethod
    def example_trace() -> Trace | None:
        """The first shipped trace, loaded afresh (each session gets its own copy), or None."""
        shipped = tracefile.shipped()
        if not shipped:
            return None
        try:
            return tracefile.load_shipped(shipped[0][1])
        except tracefile.TraceFileError:
            log.error("shipped trace %s unreadable: %s", shipped[0][1], traceback.format_exc())
            return None

    def _empty_step(self, msg: str) -> tuple:
        return ("", empty_figure("The draft tree of a step appears here."), gr.Plot(visible=False),
                empty_figure("The automaton around the match state appears here."), "", [])

    def _step_outputs(self, trace: Trace, k: int, viewport: Any = None) -> tuple:
        v = render_step(trace, k, width=fig_width(viewport))
        cost = gr.Plot(value=v.cost, visible=True) if v.cost is not None else gr.Plot(visible=False)
        return v.sentence, v.tree, cost, v.automaton, v.rows, v.spans

    def inspector_show(self, sess: Session | None, k: Any, viewport: Any = None) -> tuple:
        trace = sess.trace if isinstance(sess, Session) else None
        if trace is None or trace.n == 0:
            return self._empty_step("")
        return self._step_outputs(trace, clamp_step(trace, (k or 1) - 1), viewport)

    def inspector_move(self, sess: Session | None, k: Any, delta: int) -> Any:
        trace = sess.trace if isinstance(sess, Session) else None
        if trace is None or trace.n == 0:
            return gr.skip()
        return clamp_step(trace, (k or 1) - 1 + delta) + 1

    def inspector_tick(self, sess: Session | None, k: Any) -> tuple:
        """Play: advance one step; stop at the end."""
        trace = sess.trace if isinstance(sess, Session) else None
        if trace is None or trace.n == 0:
            return gr.skip(), gr.Timer(active=False), gr.Button(value="▶ Play"), False
        nxt = clamp_step(trace, (k or 1) - 1 + 1)
        if nxt >= trace.n - 1:
            return nxt + 1, gr.Timer(active=False), gr.Button(value="▶ Play"), False
        return nxt + 1, gr.skip(), gr.skip(), gr.skip()

    def inspector_play(self, sess: Session | None, k: Any, playing: bool) -> tuple:
        trace = sess.trace if isinstance(sess, Session) else None
        if playing or trace is None or trace.n == 0:
            return gr.Timer(active=False), gr.Button(value="▶ Play"), False, gr.skip()
        start = gr.skip()
        if clamp_step(trace, (k or 1) - 1) >= trace.n - 1:
            start = 1  # at the end: play again from the start
        return gr.Timer(active=True), gr.Button(value="⏸ Pause"), True, start

    def inspector_jump(self, sess: Session | None, evt: gr.SelectData) -> Any:
        trace = sess.trace if isinstance(sess, Session) else None
        k = step_of_span(trace, evt.index) if evt is not None else None
        return gr.skip() if k is None else k + 1

    # -- chat (RACER with an automaton that persists across turns) ----------------------------------

    def chat(self, sess: Session | None, message: str, system: str, *vals: Any) -> Iterator[tuple]:
        """Outputs: chatbot, input box, chat status, send button, state, Stop button."""
        sess = sess if isinstance(sess, Session) else Session()
        history = list(sess.chat_messages)
        job = sess.begin("chat")
        idle = (gr.Button(interactive=True), sess, gr.Button(interactive=False))
        try:
            if job.stop.is_set():     # Stop was pressed while it waited in the queue
                yield (gr.skip(), gr.skip(), "⏹ Stopped before it started.") + idle
                return
            yield from self._in_slot(lambda status: (gr.skip(), gr.skip(), status) + (gr.skip(),) * 3,
                                     self._chat(sess, job, history, message, system, vals, idle))
        except UserError as e:
            gr.Warning(str(e))
            yield (gr.skip(), gr.skip(), f"⚠️ {e}") + idle
        except Exception as e:  # noqa: BLE001
            log.error("chat failed: %s", traceback.format_exc())
            msg = fault_message(e, self.store.peek())
            release_memory(e)
            yield (history, gr.skip(), msg) + idle
        finally:
            sess.end(job)
            self.desk.decode_ended()

    def _chat(self, sess: Session, job: Job, history: list[dict[str, str]], message: str, system: str,
              vals: tuple[Any, ...], idle: tuple) -> Iterator[tuple]:
        notes: list[str] = []
        message = clean_text(message, "message", self.max_chars, notes)
        system = clean_text(system, "system prompt", self.max_chars, notes)
        if not message.strip():
            raise UserError("Type a message first.")
        if len(sess.chat_messages) // 2 >= self.limits.chat_turns:
            raise UserError(f"This chat has reached {self.limits.chat_turns} turns; press Reset chat to start over.")
        s, more = self._settings(vals)
        notes += more
        lm = self._model(s)
        msgs = history + [{"role": "user", "content": message}]
        try:
            ids = self._prompt_ids(lm, msgs, system)
        except UserError as e:
            raise UserError(f"{e} (the whole conversation counts; Reset chat starts a new one)") from e
        cfg = self._config(lm, s, len(ids), notes)
        cfg.detail = True
        key = (lm.name, tuple(sorted(racer_options(s).items())), capacity_value(s))
        fresh = sess.chat_drafter is None or sess.chat_key != key
        if fresh:
            sess.chat_drafter = make_drafter("racer", vocab_size=lm.vocab_size, **racer_options(s))
            sess.chat_sizer = make_sizer(lm) if uses_auto(s) else None
            sess.chat_key = key
            sess.chat_fed = []
            sess.chat_turns_log = []
        new_from = common_prefix(sess.chat_fed, ids)
        kw = {"sizer": sess.chat_sizer} if getattr(sess, "chat_sizer", None) is not None else {}
        run = DecodeRun(lm, ids, sess.chat_drafter, cfg, stop_event=job.stop, new_from=new_from, **kw)
        shown = history + [{"role": "user", "content": message}, {"role": "assistant", "content": ""}]
        yield (shown, "", "RACER is writing… (Stop ends it)", gr.Button(interactive=False), gr.skip(),
               gr.Button(interactive=True))
        tok = lm.tokenizer
        out: list[int] = []
        steps = []
        last = 0.0
        for rec in run:
            steps.append(rec)
            out.extend(rec.committed)
            now = time.perf_counter()
            if now - last >= TEXT_EVERY_S:
                last = now
                shown[-1] = {"role": "assistant", "content": tok.decode(out, skip_special_tokens=True)}
                yield shown, gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip()
        res = run.result
        text = res.text
        sess.chat_messages = msgs + [{"role": "assistant", "content": text}]
        sess.chat_fed = list(ids) + list(res.token_ids)
        # The drafter lives across turns: replaying this turn replays the earlier ones first.
        if run.start is not None:
            sess.chat_turns_log.append(Turn(run.start, steps))
        sess.trace = self.trace_from(lm, steps, ids, "chat", message.strip().splitlines()[0], s, res.stop_reason,
                                     list(sess.chat_turns_log) if run.start is not None else None, run.sizer)
        notes += sess.fit(self.max_session_bytes)
        size = (steps[-1].info.get("automaton_size") if steps and steps[-1].info else None)
        if size is None and len(steps) > 1:
            size = steps[-2].info.get("automaton_size")
        turn = len(sess.chat_messages) // 2
        st = (f"Turn {turn}: {numbers_md(run_numbers(steps))}; "
              f"the automaton {'started fresh' if fresh else 'kept everything from earlier turns'}"
              f"{f' and now holds {size} nodes' if size else ''}; the prompt's first {new_from} tokens were "
              f"already known to it. The inspector above now shows this turn.")
        note = self._notes_md(notes)
        yield (sess.chat_messages, gr.skip(), st + (f"  \n{note}" if note else "")) + idle

    def chat_reset(self, sess: Session | None) -> tuple:
        if isinstance(sess, Session):
            sess.reset_chat()
        return [], "Chat reset: the next message starts a fresh automaton."

    # -- benchmark --------------------------------------------------------------------------------

    @staticmethod
    def _shipped_rows() -> list[Any]:
        """The rows the Benchmark view's Run decodes from (the shipped prompts); none if unreadable."""
        try:
            from racer.bench import load_rows
            return load_rows()[0]
        except Exception:  # noqa: BLE001
            return []

    def shipped_prompts(self) -> tuple[int, int] | None:
        """How many prompts, in how many categories, the Benchmark view's Run decodes from."""
        rows = self._shipped_rows()
        return (len(rows), len({r.category for r in rows})) if rows else None

    def bench_categories(self) -> list[str]:
        return sorted({r.category for r in self._shipped_rows()})

    def benchmark(self, sess: Session | None, viewport: Any, category: str, per_category: Any, max_new: Any, methods: list[str],
                  measure_curve: bool, model: Any, capacity_mode: Any, capacity: Any, automaton_capacity: Any,
                  window: Any, topk: Any, breadth_rule: Any, merge: Any, temperature: Any, top_p: Any, seed: Any,
                  max_new_tokens: Any, progress: gr.Progress = gr.Progress()) -> tuple:
        """Run part of the shipped benchmark on this hardware. Outputs: status, overall table,
        category table, 5 figures, cost note, report files, state, Run button, Stop button.
        (Settings are spelled out: Gradio finds the progress tracker only among positional
        parameters.)"""
        vals = (model, capacity_mode, capacity, automaton_capacity, window, topk, breadth_rule, merge, temperature,
                top_p, seed, max_new_tokens)
        sess = sess if isinstance(sess, Session) else Session()
        job = sess.begin("benchmark")
        idle = (gr.Button(interactive=True), gr.Button(interactive=False))
        skips = (gr.skip(),) * 9
        try:
            if job.stop.is_set():     # Stop was pressed while it waited in the queue
                return ("⏹ Stopped before it started.",) + skips + (sess,) + idle
            return self.slots.call(self._benchmark, sess, job, category, per_category, max_new, methods,
                                   measure_curve, vals, progress, viewport) + idle
        except UserError as e:
            gr.Warning(str(e))
            return (f"⚠️ {e}",) + skips + (gr.skip(),) + idle
        except Exception as e:  # noqa: BLE001
            log.error("benchmark failed: %s", traceback.format_exc())
            msg = fault_message(e, self.store.peek()) if is_oom(e) else \
                f"❌ The benchmark failed: {e.__class__.__name__}: {e}"
            release_memory(e)
            return (msg,) + skips + (gr.skip(),) + idle
        finally:
            sess.end(job)
            self.desk.decode_ended()

    def _benchmark(self, sess: Session, job: Job, category: str, per_category: Any, max_new: Any,
                   methods: list[str], measure_curve: bool, vals: tuple, progress: Any, viewport: Any = None) -> tuple:
        from racer.bench import BenchSettings, build_summary, context_lengths, load_rows, measure_cost_curve, run_rows
        from racer.bench.methods import LoopMethod
        from racer.bench.report import write_report

        s, notes = self._settings(vals)
        methods = bench_methods(methods, notes)
        n = clamp_count(per_category, "prompts per category", 1, 5, 1, notes)
        cats = None if not category or category == "all" else [category]
        rows, skipped = load_rows(None, categories=cats, per_category=n)
        lim = self.limits
        most = max(1, min(lim.bench_max_prompts, lim.bench_max_runs // len(methods)))
        if len(rows) > most:
            why = (f"this server runs up to {lim.bench_max_prompts}" if most == lim.bench_max_prompts else
                   f"this server decodes up to {lim.bench_max_runs} prompt × method runs per benchmark")
            notes.append(f"{len(rows)} prompts asked; {why}, so the first {most} run")
            rows = rows[:most]
        cap = min(self.limits.max_new_tokens, 256)
        max_new_i = clamp_count(max_new, "new tokens per prompt", 8, cap, min(64, cap), notes)
        lm = self._model(s)
        opts = racer_options(s)
        bms = [LoopMethod(m, (lambda lm_, m=m: make_drafter(m, vocab_size=lm_.vocab_size, **opts)))
               if m == "racer" else m for m in methods]
        st = BenchSettings(max_new_tokens=max_new_i, capacity=capacity_value(s), temperature=s.temperature,
                           top_p=s.top_p, seed=s.seed, repeats=1, warmup=1, warmup_tokens=16)
        total = sum(len(r.turns) for r in rows) * len(methods)
        stop = job.stop
        t0 = time.perf_counter()
        done = [0]
        limit_s = self.limits.bench_time_limit_s

        class _Stopped(KeyboardInterrupt):
            """Ends the run between two results; racer.bench keeps what finished."""

        def on_result(res: dict[str, Any]) -> None:
            done[0] += 1
            progress((done[0], total), desc=f"{res['question_id']} · {res['method']}", unit="runs")
            if stop.is_set():
                raise _Stopped()
            if time.perf_counter() - t0 > limit_s:
                notes.append(f"stopped at this server's benchmark time limit ({limit_s:.0f} s)")
                raise _Stopped()

        progress(0, desc="warming up (untimed)")
        import io
        buf = io.StringIO()
        run = run_rows(lm, rows, bms, st, skipped=list(skipped), progress=False, log=buf, on_result=on_result)
        curve = None
        if measure_curve and run.results and not run.interrupted:
            progress(0.99, desc="measuring the cost curve")
            try:
                curve = measure_cost_curve(lm, context_lengths(run.results))
            except Exception as e:  # noqa: BLE001
                notes.append(f"cost curve failed: {e}")
        summary = build_summary(lm, run, command="RACER Studio app", data={"questions_run": len(rows)},
                                cost_curve=curve)
        # In this session's folder (removed with the session, by age and by the total-size cap).
        # The report's figures are drawn on the page; only report.md and summary.json are
        # offered for download, so the folder holds just those (the plots' HTML pages and their
        # copy of plotly.js were 4.7 MB a run).
        out_dir = self.desk.run_folder(sess)
        import json
        (out_dir / "summary.json").write_text(json.dumps(summary, indent=1, ensure_ascii=False), encoding="utf-8")
        write_report(out_dir, summary, None, images=False)
        self.desk.workspace.sweep(keep=out_dir)
        state = "⏹ Stopped early; the tables cover what finished." if run.interrupted else "✅ Done."
        status = (f"{state} {len(run.results)} runs ({len(rows)} prompts × {len(methods)} methods) on "
                  f"**{summary.get('hardware') or lm.device}** in {time.perf_counter() - t0:.0f} s, "
                  f"{max_new_i} new tokens each.")
        if notes:
            status += "  \n" + self._notes_md(notes)
        files = [str(out_dir / "report.md"), str(out_dir / "summary.json")]
        sess.bench_summary = summary
        sess.bench_files = files
        more = sess.fit(self.max_session_bytes)
        if more:
            status += "  \n" + self._notes_md(more)
        return self.bench_view(summary, status, files, viewport) + (sess,)

    def bench_view(self, summary: dict[str, Any], status: str, files: list[str] | None, viewport: Any = None) -> tuple:
        """Status, tables, figures (made visible), cost note and files for a benchmark summary."""
        from racer.bench.report import category_table, cost_section, overall_table
        figs = {k: fluid(v, viewport) for k, v in bench_figures(summary).items()}
        chosen = self._chosen_size(summary)
        cc = summary.get("cost_curve")
        auto = (summary.get("settings") or {}).get("capacity") == "auto"
        figs.pop("cost_curve", None)
        if not cc:
            lm = self.store.peek()
            cached = cost_curve_figure_data(lm, context=256) if lm is not None else None
            if cached:
                figs["cost_curve"] = fluid(cost_figure(dict(cached, chosen_T=chosen), width=PLOT_WIDTH,
                                                       hardware=f"{summary.get('hardware')}: the cached curve that "
                                                                f"sizes trees (capacity auto)"), viewport)
        if cc:
            figs["cost_curve"] = fluid(cost_figure({"sizes": cc["sizes"], "ms": cc["ms"], "chosen_T": chosen},
                                                   width=PLOT_WIDTH,
                                                   hardware=f"{summary.get('hardware')}, context {cc['context']} tokens"),
                                       viewport)
        cost_md = (f"Tree size used by RACER: **{chosen if chosen else '–'}** nodes "
                   f"({'chosen automatically: the mean per step' if auto else 'fixed in Settings'}).\n\n"
                   + cost_section(summary))

        def fig(name: str) -> Any:
            f = figs.get(name)
            return gr.Plot(value=f, visible=True) if f is not None else gr.Plot(visible=False)
        return (status, "#### Overall\n\n" + overall_table(summary) + ties_md(summary),
                "#### By category\n\nEach cell: MAT (tokens per verification forward) / speed-up over plain "
                "decoding (`ar`).\n\n" + category_table(summary),
                fig("benchmark"), fig("acceptance"), fig("latency"), fig("tokens_vs_time"), fig("cost_curve"),
                cost_md, gr.File(value=files, visible=bool(files)))

    def bench_initial(self, sess: Session | None, viewport: Any = None) -> tuple:
        """On opening the Benchmark view: this session's last run, else results shipped in
        benchmarks/ (labelled as such), else an invitation to run."""
        summ = getattr(sess, "bench_summary", None) if isinstance(sess, Session) else None
        if summ is not None:
            return (gr.skip(),) * 10
        kind = machine_kind()
        shipped = find_shipped_summary(kind)
        if shipped is None:
            return ("No benchmark run yet in this session: pick a category and press **Run the benchmark**.",) + \
                (gr.skip(),) * 9
        path, summ = shipped
        status = shipped_status(path, summ, kind, self.store.peek(), self.shipped_prompts())
        return self.bench_view(summ, status, [str(path)], viewport)

    @staticmethod
    def _chosen_size(summary: dict[str, Any]) -> int | None:
        cap = (summary.get("settings") or {}).get("capacity")
        if isinstance(cap, int):
            return cap
        r = (summary.get("methods") or {}).get("racer") or {}
        nodes = (r.get("overall") or {}).get("tree_nodes")
        return int(round(nodes)) if nodes else None

    # -- explainer --------------------------------------------------------------------------------

    def explainer(self, sess: Session | None, viewport: Any, *vals: Any) -> tuple:
        """Figures for the walk-through (see racer_app.explainer): the preset runs' tree, the seven
        stages of one step, where the tokens came from in both runs, the cost curve, the limits."""
        width = fig_width(viewport)
        n_out = 3 + 2 * len(X.STAGE_INTROS) + 4
        try:
            preset, lm = self.explainer_preset()
            win, cannot = preset.win, preset.cannot
            k = preset.step
            tree = render_step(win, k, width=width)
            an = step_anatomy(None, win, k)
            stages: list[Any] = []
            for st in X.STAGE_INTROS:
                if an.data is None:
                    stages += [an.error, gr.skip()]
                    continue
                view = render_stage(st, an.data, win, width=width)
                stages += [stage_md(st, an.data, win.decode_one, title=False), view.figure]
            where = ("on **" + friendly_model_name(lm.name) + "**" if preset.live else
                     "recorded with **" + (win.model or "the default model") + "** (no model is loaded here yet, so "
                     "these are the example traces that ship with the app)")
            intro = (f"*Preset runs {where}: “{X.WIN_TITLE}”, {numbers_md(run_numbers(win.steps))}; "
                     f"“{X.CANNOT_TITLE}”, {numbers_md(run_numbers(cannot.steps))}. The stages below follow step "
                     f"{k + 1} of the first.*")
            src_win = fluid(acceptance_by_source(win.steps, width=PLOT_WIDTH, height=340,
                                                 title=f"“{X.WIN_TITLE}”: MAT {run_numbers(win.steps).mat:.2f}"),
                            viewport)
            src_cannot = fluid(acceptance_by_source(cannot.steps, width=PLOT_WIDTH, height=340,
                                                    title=f"“{X.CANNOT_TITLE}”: MAT {run_numbers(cannot.steps).mat:.2f}"),
                               viewport)
            curve = (cost_curve_figure_data(lm) if lm is not None else None) or find_cost_curve(win.steps)
            if curve is None and win.cost_curve is not None:
                curve = win.cost_curve.table(256)
                hw = "the machine that recorded the example traces"
            else:
                hw = f"this machine: {lm.device}" if lm is not None else ""
            if curve is None:
                # Reference measurement (DESIGN §4: SmolLM2-135M float32 on 2 CPU cores), clearly labelled.
                curve = {"sizes": [1, 8, 16, 32, 64], "ms": [41, 59, 70, 95, 147]}
                hw = "reference: 2 CPU cores, float32, SmolLM2-135M (run the Benchmark to measure this machine)"
            cost = fluid(cost_figure(curve, width=PLOT_WIDTH, hardware=hw), viewport)
            limits = (f"On these two runs: “{X.WIN_TITLE}” committed **{run_numbers(win.steps).mat:.2f}** tokens per "
                      f"forward pass, “{X.CANNOT_TITLE}” **{run_numbers(cannot.steps).mat:.2f}**.")
            return (intro, tree.sentence, tree.tree, *stages, src_win, src_cannot, cost, limits)
        except Exception as e:  # noqa: BLE001
            log.error("explainer failed: %s", traceback.format_exc())
            msg = f"The preset runs could not be made: {e.__class__.__name__}: {e}"
            return (msg,) + (gr.skip(),) * (n_out - 1)

    def explainer_preset(self) -> tuple[X.Preset, Any]:
        """The walk's preset runs: made with the loaded default model, else the shipped traces."""
        lm = self.store.peek("default")
        if lm is not None:
            return self.preset(lm), lm
        preset = X.get_preset("shipped")
        if preset is None:
            by_title = {t.split(" (")[0]: p for t, p in tracefile.shipped()}
            traces = []
            for title in (X.WIN_TITLE, X.CANNOT_TITLE):
                if title not in by_title:
                    raise UserError(f"the example trace “{title}” is missing from assets/traces")
                tr = tracefile.load_shipped(by_title[title])
                tr.source = "preset"
                traces.append(tr)
            preset = X.Preset(traces[0], traces[1], X.pick_step(traces[0].steps), live=False)
            X.put_preset("shipped", preset)
        return preset, None

    def preset(self, lm: Any) -> X.Preset:
        """The preset run for `lm`, made once per process (a second caller waits for the first)."""
        with self._preset_lock:
            # A decode like any other: in the slot, never beside a visitor's race.
            return self._preset_made(lm, self.slots.call)

    def _preset_made(self, lm: Any, call: Callable[..., Any]) -> X.Preset:
        """The preset for `lm`, run on a slot by `call(fn, lm)` if not made yet (the caller holds
        _preset_lock)."""
        preset = X.get_preset(lm.name)
        if preset is None:
            preset = call(self._run_preset, lm)
            X.put_preset(lm.name, preset)
        return preset

    def _between_visitors(self, fn: Callable[[], None]) -> None:
        """`fn` in the decode slot; then a pause, so a visitor waiting for the slot takes it before
        the next call does (a thread that gives the slot back and asks again would get it first)."""
        self.slots.call(fn)
        time.sleep(0.05)

    def warm_up_in_background(self) -> None:
        """After the start-up model loads: measure this machine's cost curve if trees are sized
        automatically (once per machine, cached on disk), load the model's cold rows if they are
        cached, then make the explainer's preset run and a short race nobody watches
        (`_quiet_race`), so none of it waits for the first visitor, and last compute the cold
        rows if they were not cached. The status line says what is going on; the server's log
        says when it is done.

        The decode slot is taken before the model has loaded and held until the quiet race ends,
        so a visitor's first race always runs after all of it: once a visitor's race could take
        the slot between two of these jobs (whoever asked first when the model was ready got it),
        and then it ran before the quiet race had taught the clock, and the quiet race after it,
        beside whatever the visitor did next. The cold rows take longest (once per model, cached
        on disk) and, when not cached, go a batch at a time after it, so a visitor waits for one
        batch, not for all."""
        def work() -> None:
            t0 = time.perf_counter()
            try:
                with self._preset_lock, self.slots.hold() as slot:
                    self.store.wait()
                    lm = self.store.peek()
                    if lm is None:
                        return
                    if uses_auto(self.defaults) and lm.cost_curve is None:
                        self.warming = "measuring this machine's cost curve (once; it is cached on disk)"
                        slot.call(make_sizer, lm)
                    # Cold rows cached on disk load here, so the preset and the quiet race draft
                    # as a visitor's race will, and nothing of the warm-up runs beside one.
                    try:
                        slot.call(functools.partial(get_cold_rows, lm, make=False))
                    except Exception:  # noqa: BLE001 - computed (or reported) after the quiet race
                        log.error("cached cold rows unreadable: %s", traceback.format_exc())
                    self.warming = "preparing the How it works example"
                    self._preset_made(lm, slot.call)
                    if lm.cost_curve is not None:
                        self.warming = "timing a short race, so the first race's clock knows this machine when quiet"
                        slot.call(self._quiet_race, lm)
                if lm.cold_rows is None:
                    self.warming = "computing the model's cold rows (once; they are cached on disk)"
                    get_cold_rows(lm, call=self._between_visitors)
                print(f"RACER Studio: warm-up done in {time.perf_counter() - t0:.1f} s", flush=True)
            except Exception:  # noqa: BLE001 - each view retries when used
                log.error("warm-up failed: %s", traceback.format_exc())
            finally:
                self.warming = None
        self.warming = "starting"
        threading.Thread(target=work, name="racer-warm-up", daemon=True).start()

    def _quiet_race(self, lm: Any) -> Race:
        """A race of the race's methods on a copy-heavy example, with this server's default
        settings, before any visitor: a race teaches the clock this machine's quiet levels
        if it ran quiet (racer.race.QuietLevels), and until one has, a disturbed step is charged
        its wall time. A visitor's first race is often disturbed from its first forward (the page
        rendering it on the same cores: 61 of 66 forwards on the AVX512-BF16 CPU); with this one
        behind it, it is charged what this machine does when quiet. One race, all methods in the
        same minutes, as the levels need (an earlier seed from the preset's RACER run alone tilted
        the speed-ups by the host's drift)."""
        ex = ({e["title"]: e for e in load_examples()}.get(QUIET_RACE_EXAMPLE)
              or {"prompt": "Repeat this sentence twice: the quick brown fox jumps over the lazy dog."})
        ids = build_input_ids(lm.tokenizer, ex["prompt"], system=ex.get("system") or None)
        s = self.defaults
        room = max(1, lm.max_context - len(ids) - 2)
        cfg = DecodeConfig(max_new_tokens=min(QUIET_RACE_TOKENS, self.limits.max_new_tokens, room),
                           capacity=capacity_value(s), time_limit_s=self.limits.time_limit_s)
        race = Race(lm, ids, self._race_drafters(lm, s), cfg, detail_for=("racer",),
                    run_kwargs=self._sizer_kwargs(lm, s, RACE_METHODS), time_limit_s=self.limits.time_limit_s)
        for _ in race:
            pass
        return race

    def _run_preset(self, lm: Any) -> X.Preset:
        """Both preset runs, with this server's default settings (the same sizing as a race)."""
        examples = {e["title"]: e for e in load_examples()}
        n = X.PRESET_TOKENS_GPU if lm.device.type == "cuda" else X.PRESET_TOKENS_CPU
        s = self.defaults
        traces = []
        for title in (X.WIN_TITLE, X.CANNOT_TITLE):
            ex = examples.get(title) or {"prompt": "Repeat this sentence twice: the quick brown fox jumps over the "
                                                   "lazy dog."}
            ids = build_input_ids(lm.tokenizer, ex["prompt"], system=ex.get("system") or None)
            sizer = make_sizer(lm) if uses_auto(s) else None
            run = DecodeRun(lm, ids, make_drafter("racer", vocab_size=lm.vocab_size, **racer_options(s)),
                            DecodeConfig(max_new_tokens=n, capacity=capacity_value(s), detail=True,
                                         time_limit_s=self.limits.time_limit_s), sizer=sizer)
            steps = list(run)
            traces.append(self.trace_from(lm, steps, ids, "preset", title, s, run.result.stop_reason,
                                          [Turn(run.start, steps)], run.sizer))
        return X.Preset(traces[0], traces[1], X.pick_step(traces[0].steps))

    def explainer_to_inspector(self, sess: Session | None) -> Any:
        """Load the preset run into this session's inspector."""
        lm = self.store.peek("default")
        preset = X.get_preset(lm.name) if lm is not None else X.get_preset("shipped")
        if not isinstance(sess, Session) or preset is None:
            gr.Warning("The preset run is not ready yet.")
            return gr.skip(), gr.skip()
        sess.trace = preset.trace
        sess.anatomy = None
        return sess, gr.Tabs(selected="inspector")


def friendly_model_name(name: str) -> str:
    """A model's name without its file's quantisation suffix (e.g. ".Q4_1")."""
    return re.sub(r"[.-](Q\d\w*|q\d\w*|gguf)$", "", str(name))


def bench_methods(methods: Any, notes: list[str]) -> list[str]:
    """The benchmark's methods in the order given, each once, plain decoding first if missing
    (speed-ups are measured against it); raises UserError when nothing is left to compare."""
    picked = methods if isinstance(methods, (list, tuple)) else ([methods] if methods else [])
    out: list[str] = []
    twice: list[str] = []
    for m in picked:
        m = str(m).strip() if m is not None else ""
        if not m:
            continue
        if m in out:
            if m not in twice:
                twice.append(m)
            continue
        out.append(m)
    if twice:
        notes.append(f"{', '.join(twice)} listed more than once; each method runs once")
    if "ar" not in out:
        out = ["ar"] + out
        notes.append("plain decoding (ar) added: speed-ups are measured against it")
    if len(out) < 2:
        raise UserError("Pick at least one method besides plain decoding.")
    return out


#: CPU kinds as benchmarks/ folder names spell them (benchmarks/README.md), and in words.
KIND_WORDS = {"avx512bf16": "an AVX512-BF16 CPU", "avx2": "an AVX2 CPU", "gpu": "a GPU"}


def machine_kind() -> str:
    """This machine's kind as a benchmarks/ folder name spells it."""
    import torch
    from racer.models import cpu_has_native_bf16
    if torch.cuda.is_available():
        return "gpu"
    return "avx512bf16" if cpu_has_native_bf16() else "avx2"


def run_kind(name: str) -> str | None:
    """The machine kind in a benchmarks/ folder name (model-data-dtype-kind-date), if it names one."""
    parts = name.split("-")
    return next((k for k in KIND_WORDS if k in parts), None)


def find_shipped_summary(kind: str | None = None) -> tuple[Path, dict[str, Any]] | None:
    """A benchmarks/**/summary.json shipped with the app: a run of the default model on this kind
    of machine first, a Spec-Bench run before the shipped prompts, then by name (clones give every
    file the same date, so no modification time decides)."""
    import json
    root = ASSETS.parent / "benchmarks"
    try:
        found = list(root.glob("*/summary.json"))
    except OSError:
        return None

    def rank(p: Path) -> tuple:
        name = p.parent.name
        return (run_kind(name) != kind, not name.startswith("smollm2"), "specbench" not in name, name)
    for path in sorted(found, key=rank):
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(d, dict) and d.get("methods"):
            return path, d
    return None


def shipped_status(path: Path, summ: dict[str, Any], kind: str, lm: Any = None,
                   runnable: tuple[int, int] | None = None) -> str:
    """What a shipped run is (its data, dtype and machine) against this machine, in plain words."""
    data = summ.get("data") or {}
    src = Path(str(data.get("path") or "the shipped prompts")).name
    src = {"spec_bench.jsonl": "Spec-Bench", "bench_prompts.jsonl": "the shipped prompts"}.get(src, src)
    n_cat = len(summ.get("categories") or [])
    turns = data.get("questions_run")
    what = f"{turns} prompts in {n_cat} categories of {src}" if turns else src
    theirs = run_kind(path.parent.name)
    where = KIND_WORDS.get(theirs or "", "another machine")
    out = (f"Showing a run shipped with the app, **{path.parent.name}**: {what}, "
           f"{(summ.get('settings') or {}).get('max_new_tokens', '?')} new tokens, {summ.get('model')} in "
           f"{summ.get('dtype')} on {where} ({summ.get('created', '')}).")
    mine = f"{KIND_WORDS[kind]} running {str(lm.dtype).replace('torch.', '')}" if lm is not None else KIND_WORDS[kind]
    if theirs == kind and (lm is None or str(lm.dtype).endswith(str(summ.get("dtype")))):
        out += f" This machine is the same kind ({mine}), but a shared machine's figures still vary from run to run."
    else:
        out += f" This machine is {mine}, so its own figures will differ."
    sizes = f" ({runnable[0]} in {runnable[1]} categories; pick a category and a count above)" if runnable else ""
    return out + f" **Run the benchmark** to measure this machine on the shipped prompts{sizes}."


def ties_md(summary: dict[str, Any]) -> str:
    """One line per method whose greedy output is not identical to plain decoding on every turn: how
    many of those differences are floating-point ties (a near-equal top two logits) and how many bugs."""
    chk = summary.get("identical_check") or {}
    lines = []
    for m, d in (summary.get("methods") or {}).items():
        i = d.get("identical")
        if not i or i.get("identical") == i.get("compared"):
            continue
        bugs = int(i.get("mismatches", 0)) + int(i.get("length", 0))
        lines.append(f"`{m}`: {i['identical']} of {i['compared']} identical to plain decoding; {i.get('ties', 0)} "
                     f"differ first where the model's top two logits are within {chk.get('tie_tolerance', '?')} "
                     f"(a floating-point tie: a different batch shape rounds them the other way, and either token "
                     f"is the model's greedy choice), {i.get('inherited', 0)} follow an earlier turn that did, "
                     f"{bugs} {'is a bug' if bugs == 1 else 'are bugs'}.")
    return "\n\n" + "  \n".join(lines) if lines else ""


# -- examples ---------------------------------------------------------------------------------------

ASSETS = Path(__file__).resolve().parent.parent / "assets"


@functools.lru_cache(maxsize=1)
def load_examples() -> list[dict[str, str]]:
    import json
    try:
        return json.loads((ASSETS / "examples.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return [{"title": "Repeat", "category": "writing", "system": "",
                 "prompt": "Repeat this sentence twice: the quick brown fox jumps over the lazy dog.",
                 "why": "Copying is RACER's best case."}]


CANNOT = {"Short original poem", "One-line joke", "Open brainstorming", "Continue a passage"}


def example_label(e: dict[str, str]) -> str:
    return f"{e['title']} — {'little to copy' if e['title'] in CANNOT or e['category'] == 'writing' and len(e['prompt']) < 100 else 'copy-heavy'}"


__all__ = ["Studio", "UserError", "load_examples", "example_label", "FIELDS", "METHOD_TITLES", "step_sentence"]
