"""Handlers of the inspector's anatomy and "what if" views and of trace files (export, load,
the shipped examples). Light handlers: they replay recorded steps, never the model.

`app.py` wires them; `Studio` (racer_app.handlers) owns one `TraceViews`.
"""
from __future__ import annotations

import logging
import traceback
from pathlib import Path
from typing import Any

import gradio as gr

from racer import anatomy as A

from . import tracefile
from .anatomy_text import STAGE_TITLES, stage_md, what_if_md, what_if_table_md, why_missed_md
from .anatomy_view import step_anatomy, unavailable, what_if
from .inspector import clamp_step, empty_figure, fig_width
from .session import Session, Trace
from .stage_render import render_stage, render_what_if

log = logging.getLogger("racer_app")

#: The stage selector's choices: (label, key).
STAGE_CHOICES = [(f"{i + 1} {label}", key) for i, (key, label) in enumerate(
    zip(A.STAGES, ("Match", "Retrieval", "Logits", "Merge & size", "Tree attention", "Verify", "Update")))]
SOURCE_CHOICES = ["retrieval", "logits", "lookup"]
#: The what-if capacity choices: the run's own size, or a fixed one.
RUN_SIZE = "the run's"
CAPACITY_CHOICES = [RUN_SIZE] + [str(c) for c in A.WHAT_IF_CAPACITIES]
RULE_CHOICES = ["paper", "released"]


def _trace(sess: Any) -> Trace | None:
    return sess.trace if isinstance(sess, Session) else None


def stage_key(stage: Any) -> str:
    return stage if stage in A.STAGES else A.STAGES[0]


class TraceViews:
    def __init__(self, studio: Any) -> None:
        self.studio = studio

    # -- anatomy -------------------------------------------------------------------------------

    def anatomy_show(self, sess: Session | None, k: Any, stage: Any, layer: Any, viewport: Any = None) -> tuple:
        """Outputs: the stage's words, its picture, a second picture, its table (HTML), the
        logits-layer slider."""
        trace = _trace(sess)
        stage = stage_key(stage)
        hidden = gr.Plot(visible=False)
        no_layer = gr.Slider(visible=False)
        if trace is None or trace.n == 0:
            msg = unavailable(None)
            return (msg, empty_figure("Each stage of a step appears here."), hidden, "", no_layer)
        step = clamp_step(trace, (k or 1) - 1)
        an = step_anatomy(sess, trace, step)
        if an.data is None:
            return (f"#### {STAGE_TITLES[stage]}\n\n{an.error}", empty_figure(an.error[:90]), hidden, "", no_layer)
        try:
            layer_n = None
            layers = len((an.data.get("logits") or {}).get("layers") or []) if not an.data.get("final") else 0
            if stage == "logits" and layers:
                try:
                    layer_n = max(1, min(layers, int(float(layer))))
                except (TypeError, ValueError):
                    layer_n = layers
            view = render_stage(stage, an.data, trace, width=fig_width(viewport), layer=layer_n)
            slider = (gr.Slider(minimum=1, maximum=max(2, layers), value=layer_n, step=1, visible=True,
                                interactive=layers > 1) if stage == "logits" and layers else no_layer)
            words = stage_md(stage, an.data, trace.decode_one, layer_n)
            second = gr.Plot(value=view.second, visible=True) if view.second is not None else hidden
            return (words, view.figure, second, view.html, slider)
        except Exception as e:  # noqa: BLE001 - a picture never breaks the inspector
            log.error("stage %s failed: %s", stage, traceback.format_exc())
            return (f"The {stage} stage could not be drawn: {e.__class__.__name__}: {e}",
                    empty_figure("This stage could not be drawn."), hidden, "", no_layer)

    @staticmethod
    def stage_move(stage: Any, delta: int) -> str:
        i = A.STAGES.index(stage_key(stage))
        return A.STAGES[max(0, min(len(A.STAGES) - 1, i + delta))]

    # -- what if -------------------------------------------------------------------------------

    def what_if_show(self, sess: Session | None, k: Any, sources: Any, capacity: Any, rule: Any,
                     viewport: Any = None) -> tuple:
        """Outputs: the answer, its tree, the chart of every variant, the table of every variant, why
        the next token was missed."""
        trace = _trace(sess)
        hidden = gr.Plot(visible=False)
        if trace is None or trace.n == 0:
            return (unavailable(None), empty_figure("A re-drafted tree appears here."), hidden, "", "")
        step = clamp_step(trace, (k or 1) - 1)
        an = step_anatomy(sess, trace, step)
        if an.data is None:
            return (an.error, empty_figure(an.error[:90]), hidden, "", "")
        if an.data.get("final"):
            msg = "This last step has no forward pass and no draft: pick an earlier step."
            return (msg, empty_figure(msg), hidden, "", "")
        picked = set(sources or []) if isinstance(sources, (list, tuple, set)) else set()
        cap = str(capacity or RUN_SIZE)
        v = A.Variant("retrieval" in picked, "logits" in picked, "lookup" in picked,
                      "auto" if cap == RUN_SIZE or not cap.isdigit() else int(cap),
                      rule if rule in RULE_CHOICES else "paper")
        w, err = what_if(trace, step, v)
        why = why_missed_md(an.why, trace.decode_one)
        if w is None:
            return (err, empty_figure(err[:90]), hidden, what_if_table_md(an.table), why)
        try:
            fig, bars = render_what_if(w, an.table, trace, width=fig_width(viewport))
        except Exception:  # noqa: BLE001
            log.error("what-if figure failed: %s", traceback.format_exc())
            fig, bars = empty_figure("The re-drafted tree could not be drawn."), None
        return (what_if_md(w, trace.decode_one), fig, gr.Plot(value=bars, visible=True) if bars is not None else hidden,
                what_if_table_md(an.table), why)

    # -- trace files ---------------------------------------------------------------------------

    def export(self, sess: Session | None) -> tuple:
        """Outputs: the file to download, a note."""
        trace = _trace(sess)
        if trace is None:
            gr.Warning("No trace to export yet: run a race or chat first.")
            return gr.File(visible=False), "No trace to export yet."
        try:
            folder = self.studio.desk.run_folder(sess)
            name = "racer-trace-" + "".join(c if c.isalnum() else "-" for c in (trace.title or "run")[:32]).strip("-")
            lm = self.studio.store.peek()
            special = getattr(getattr(lm, "tokenizer", None), "all_special_ids", None) or []
            path = tracefile.save(trace, folder / f"{name or 'run'}.json.gz", special)
            self.studio.desk.workspace.sweep(keep=folder)
            kb = path.stat().st_size / 1024
            return (gr.File(value=str(path), visible=True),
                    f"Exported {trace.n} steps ({kb:.0f} KB): load it back here, or in any RACER Studio, to replay it "
                    f"without the model.")
        except Exception as e:  # noqa: BLE001
            log.error("export failed: %s", traceback.format_exc())
            return gr.File(visible=False), f"❌ The trace could not be exported: {e.__class__.__name__}: {e}"

    def load_file(self, sess: Session | None, file: Any) -> tuple:
        """Outputs: the session, a note."""
        sess = sess if isinstance(sess, Session) else Session()
        path = getattr(file, "name", None) or (file if isinstance(file, str) else None)
        if not path:
            return sess, "No file received."
        try:
            trace = tracefile.load(Path(path), max_bytes=int(self.studio.limits.session_mb * 2**20))
        except tracefile.TraceFileError as e:
            gr.Warning(f"Not loaded: {e}")
            return sess, f"⚠️ Not loaded: {e}."
        return self._take(sess, trace, f"Loaded “{trace.title or Path(path).name}”.")

    def load_example(self, sess: Session | None, title: Any) -> tuple:
        """Outputs: the session, a note."""
        sess = sess if isinstance(sess, Session) else Session()
        for t, path in tracefile.shipped():
            if t == title:
                try:
                    trace = tracefile.load_shipped(path)
                except tracefile.TraceFileError as e:
                    return sess, f"⚠️ The example could not be read: {e}."
                return self._take(sess, trace, f"Loaded the example “{t}”.")
        return sess, "Pick an example trace."

    def _take(self, sess: Session, trace: Trace, note: str) -> tuple:
        sess.trace = trace
        sess.anatomy = None
        more = sess.fit(self.studio.max_session_bytes)
        if more:
            note += " " + "; ".join(more) + "."
        return sess, note
