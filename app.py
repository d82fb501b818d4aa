"""RACER Studio — the Gradio app (layout and wiring only; logic lives in racer_app/ and racer/).

    python app.py            # loads the default model, serves http://localhost:7860 (PORT to change)

Environment: RACER_MODEL (start-up model, default "default"), RACER_ALLOWED_MODELS (comma-
separated hub ids/folders users may pick beside the shipped models; none by default), RACER_DEVICE / RACER_DTYPE, PORT, HOST,
and the per-request limits in racer_app/settings.py (RACER_MAX_NEW_TOKENS, ...).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import gradio as gr

from racer_app import explainer as X
from racer_app import trace_views as TV
from racer_app.glossary import glossary_md
from racer_app.tracefile import shipped as shipped_traces
from racer_app.format import (lane_header_html, legend_html, text_color_map)
from racer_app.gpu import on_gpu, zero_gpu
from racer_app.handlers import RACE_METHODS, RACE_REPEATS, Studio, example_label, load_examples
from racer_app.models import ModelStore
from racer_app.server import StudioBlocks
from racer_app.session import Session
from racer_app.settings import BREADTH_RULES, MERGE_CHOICES, Limits, allowed_models_from_env, model_choices

HERE = Path(__file__).resolve().parent
ASSETS = HERE / "assets"
BENCH_METHODS = ["ar", "tr", "racer", "pld", "racer-nochain", "racer-retrieval", "racer-logits", "racer-half",
                 "racer-hard", "hf", "hf-pld"]

HEADER = """<div class="racer-title"><h1>🏎️ RACER Studio</h1>
<p>Speculative decoding without a draft model: drafts from what the text already said (retrieval) and from what
the model predicted before (copy-logit), checked in one pass. Same output, fewer forward passes.</p></div>"""


def build_app(lm: Any = None, *, store: ModelStore | None = None, limits: Limits | None = None) -> gr.Blocks:
    """The app. `lm` injects a loaded model (tests); without it the start-up model loads in the
    background (status shown at the top)."""
    background = store is None and lm is None
    if store is None:
        store = ModelStore(lm, allowed=allowed_models_from_env())
        if lm is None:
            store.start(background=True)
    studio = Studio(store, limits)
    if background:
        studio.warm_up_in_background()
    lim, d = studio.limits, studio.defaults
    examples = load_examples()
    decode = dict(concurrency_id="decode", concurrency_limit=lim.decode_concurrency)
    light = dict(concurrency_id="light", concurrency_limit=None, show_progress="hidden")

    with StudioBlocks(lim, title="RACER Studio") as demo:
        # Expires `session_ttl_s` after the last decode that stored it (and when its tab closes:
        # demo.unload below); Gradio keeps at most `max_sessions` of them (StudioBlocks.launch).
        sess = gr.State(Session, time_to_live=lim.session_ttl_s, delete_callback=studio.desk.session_expired)
        # The browser's viewport width (set on load), so figures laid out in pixels fit phones.
        viewport = gr.Number(value=0, visible=False, elem_id="viewport")
        gr.HTML(HEADER)
        model_md = gr.Markdown("⏳ Loading the model…", elem_id="model-status")
        with gr.Accordion("📖 Glossary: the words this app uses, in plain language", open=False, elem_id="glossary"):
            gr.Markdown(glossary_md())
        status_timer = gr.Timer(1.0, active=True)
        queue_timer = gr.Timer(1.0, active=False)     # runs while this session's decode waits in the queue

        with gr.Tabs(elem_id="tabs") as tabs:
            # -- 1. Race ----------------------------------------------------------------------
            with gr.Tab("Race", id="race", elem_id="tab-race"):
                with gr.Row(equal_height=False):
                    with gr.Column(scale=3, min_width=300):
                        prompt = gr.Textbox(label="Prompt", lines=5, max_lines=14, elem_id="prompt",
                                            placeholder="Ask something, or pick an example →")
                        with gr.Accordion("System prompt (optional)", open=False):
                            system = gr.Textbox(show_label=False, lines=2, placeholder="e.g. You are a helpful assistant.",
                                                elem_id="system")
                        prompt_note = gr.Markdown(studio.prompt_mode(), elem_id="prompt-mode")
                        with gr.Row(elem_classes=["racer-controls"]):
                            run_btn = gr.Button("Run the race", variant="primary", elem_id="run")
                            stop_btn = gr.Button("Stop", variant="stop", interactive=False, elem_id="stop")
                        repeat = gr.Checkbox(value=studio.repeat_default, elem_id="repeat",
                                             label=f"Race {RACE_REPEATS}× and show the median with its range",
                                             info="Off by default on a CPU, where one race takes a while.")
                    with gr.Column(scale=2, min_width=280):
                        chat_ex = [e for e in examples if e.get("kind", "chat") == "chat"]
                        done_ex = [e for e in examples if e.get("kind") == "completion"]
                        gr.Examples(examples=[[e["prompt"], e.get("system", "")] for e in chat_ex],
                                    inputs=[prompt, system], example_labels=[example_label(e) for e in chat_ex],
                                    label="Example prompts (where RACER shines, and where it cannot)",
                                    examples_per_page=8)
                        gr.Examples(examples=[[e["prompt"], ""] for e in done_ex], inputs=[prompt, system],
                                    example_labels=[example_label(e) for e in done_ex],
                                    label="Completion examples, for base models (text to continue)")
                        with gr.Accordion("Why these examples?", open=False):
                            gr.Markdown("\n".join(f"- **{e['title']}**: {e['why']}" for e in examples))
                race_queue = gr.Markdown(elem_id="race-queue")
                race_status = gr.Markdown(elem_id="race-status")
                gr.HTML(legend_html(extra="Draft tokens the model accepted are coloured by where they came from."))
                lane_out = []
                with gr.Row(equal_height=False):
                    for m in RACE_METHODS:
                        with gr.Column(min_width=260, elem_classes=["racer-lane"]):
                            gr.HTML(lane_header_html(m))
                            stats = gr.Markdown(elem_id=f"stats-{m}")
                            text = gr.HighlightedText(value=[], color_map=text_color_map(), show_legend=False,
                                                      show_inline_category=False, show_label=False,
                                                      elem_id=f"text-{m}", elem_classes=["racer-text"],
                                                      show_whitespaces=True)
                            lane_out += [stats, text]
                race_plot = gr.Plot(show_label=False, elem_id="race-plot", elem_classes=["racer-plot"], visible=False)
                verdict = gr.Markdown(elem_id="verdict")

            # -- 2. Step inspector ------------------------------------------------------------------
            with gr.Tab("Step inspector", id="inspector", elem_id="tab-inspector") as tab_insp:
                insp_header = gr.Markdown(elem_id="insp-header")
                with gr.Row(elem_classes=["racer-controls"]):
                    prev_btn = gr.Button("◀ Prev", size="sm", min_width=70, elem_id="prev")
                    play_btn = gr.Button("▶ Play", size="sm", min_width=80, elem_id="play")
                    next_btn = gr.Button("Next ▶", size="sm", min_width=70, elem_id="next")
                    slider = gr.Slider(1, 2, value=1, step=1, label="Step", interactive=False, scale=4,
                                       min_width=200, elem_id="step-slider")
                sentence = gr.Markdown(elem_id="step-sentence")
                insp_text = gr.HighlightedText(value=[], color_map=text_color_map(current=True), show_legend=False,
                                               show_inline_category=False, elem_id="insp-text",
                                               label="Generated text (this step's tokens stand out) — click a token "
                                                     "to jump to its step", elem_classes=["racer-text-short"],
                                               show_whitespaces=True)
                gr.HTML(legend_html())
                with gr.Tabs(elem_id="insp-views"):
                    with gr.Tab("The step", id="overview", elem_id="view-overview") as view_overview:
                        tree_plot = gr.Plot(show_label=False, elem_id="tree-plot", elem_classes=["racer-plot"])
                        step_cost = gr.Plot(show_label=False, elem_id="step-cost", elem_classes=["racer-plot"],
                                            visible=False)
                        auto_plot = gr.Plot(show_label=False, elem_id="automaton-plot", elem_classes=["racer-plot"])
                        rows_html = gr.HTML(elem_id="copy-rows")
                    with gr.Tab("Anatomy: the step in 7 stages", id="anatomy", elem_id="view-anatomy") as view_anatomy:
                        with gr.Row(elem_classes=["racer-controls"]):
                            stage_prev = gr.Button("◀ Prev stage", size="sm", min_width=110, elem_id="stage-prev")
                            stage = gr.Radio(TV.STAGE_CHOICES, value="match", show_label=False, scale=6,
                                             elem_id="stage")
                            stage_next = gr.Button("Next stage ▶", size="sm", min_width=110, elem_id="stage-next")
                        layer = gr.Slider(1, 32, value=32, step=1, label="Logits tree: layers shown", visible=False,
                                          elem_id="stage-layer")
                        stage_md = gr.Markdown(elem_id="stage-text")
                        stage_plot = gr.Plot(show_label=False, elem_id="stage-plot", elem_classes=["racer-plot"])
                        stage_plot2 = gr.Plot(show_label=False, elem_id="stage-plot2", elem_classes=["racer-plot"],
                                              visible=False)
                        stage_html = gr.HTML(elem_id="stage-table")
                    with gr.Tab("What if?", id="whatif", elem_id="view-whatif") as view_whatif:
                        gr.Markdown("Re-draft this step from the drafter's state at that moment, with a source switched "
                                    "off, another tree size or the other breadth rule, and see how many tokens that "
                                    "tree would have committed. No model runs: under greedy decoding the model's "
                                    "tokens are known.")
                        with gr.Row():
                            wi_sources = gr.CheckboxGroup(TV.SOURCE_CHOICES, value=list(TV.SOURCE_CHOICES),
                                                          label="Sources", elem_id="wi-sources")
                            wi_cap = gr.Radio(TV.CAPACITY_CHOICES, value=TV.RUN_SIZE, label="Tree size (nodes)",
                                              elem_id="wi-capacity")
                            wi_rule = gr.Radio(TV.RULE_CHOICES, value="paper", label="Breadth rule of the logits tree",
                                               info="paper: x0's children are not halved; released: they are",
                                               elem_id="wi-rule")
                        wi_md = gr.Markdown(elem_id="wi-text")
                        wi_plot = gr.Plot(show_label=False, elem_id="wi-plot", elem_classes=["racer-plot"])
                        why_md = gr.Markdown(elem_id="why-missed")
                        wi_bars = gr.Plot(show_label=False, elem_id="wi-bars", elem_classes=["racer-plot"],
                                          visible=False)
                        wi_table = gr.Markdown(elem_id="wi-table", elem_classes=["racer-table"])
                insp_view = gr.State("overview")
                with gr.Accordion("Traces: export this one, load one, or open an example", open=False,
                                  elem_id="trace-acc"):
                    gr.Markdown("A trace is a recorded run: its steps, what the drafter learnt from each, and the text. "
                                "It replays here without the model (the anatomy and what-if included).")
                    with gr.Row():
                        trace_pick = gr.Dropdown([t for t, _ in shipped_traces()], value=None,
                                                 label="Example traces (recorded with the default model)",
                                                 elem_id="trace-pick", scale=3)
                        trace_up = gr.UploadButton("Load a trace file", file_types=[".gz", ".json"],
                                                   file_count="single", elem_id="trace-load", scale=1)
                        trace_export = gr.Button("Export this trace", elem_id="trace-export", scale=1)
                    trace_note = gr.Markdown(elem_id="trace-note")
                    trace_file = gr.File(label="Trace file", interactive=False, visible=False, elem_id="trace-file")
                with gr.Accordion("Chat with RACER — its automaton and copy-logit table persist across turns",
                                  open=False, elem_id="chat-acc"):
                    chatbot = gr.Chatbot(height=300, show_label=False, elem_id="chatbot")
                    with gr.Row():
                        chat_in = gr.Textbox(show_label=False, placeholder="Message…", scale=4, elem_id="chat-in")
                        send_btn = gr.Button("Send", variant="primary", scale=1, min_width=80)
                        chat_stop = gr.Button("Stop", variant="stop", scale=1, min_width=80, interactive=False,
                                              elem_id="chat-stop")
                        reset_btn = gr.Button("Reset chat", scale=1, min_width=100)
                    chat_queue = gr.Markdown(elem_id="chat-queue")
                    chat_status = gr.Markdown()
                play_timer = gr.Timer(0.9, active=False)
                playing = gr.State(False)

            # -- 3. Benchmark ---------------------------------------------------------------------
            with gr.Tab("Benchmark", id="bench", elem_id="tab-bench") as tab_bench:
                gr.Markdown("Run the shipped benchmark (40 original prompts in 8 categories) on **this** hardware. "
                            "Every method decodes the same prompts, interleaved so a busy machine slows all alike; "
                            "speed-ups are in wall-clock time against plain decoding. The settings of the Settings "
                            "view apply.")
                cats = ["all"] + studio.bench_categories()
                with gr.Row():
                    b_cat = gr.Dropdown(cats, value="all", label="Category", min_width=160)
                    b_n = gr.Slider(1, 5, value=1, step=1, label="Prompts per category", min_width=160)
                    b_max = gr.Slider(8, min(256, lim.max_new_tokens), value=128 if lim.on_gpu else 64, step=8,
                                      label="New tokens per prompt", min_width=160)
                with gr.Row():
                    b_methods = gr.CheckboxGroup(BENCH_METHODS, value=["ar", "tr", "racer"], label="Methods",
                                                 scale=3)
                    b_curve = gr.Checkbox(value=lim.on_gpu, label="Measure the cost curve at these prompts' lengths",
                                          info="a minute or more on a small CPU; unticked, the curve that sizes "
                                               "trees (capacity auto) is shown", scale=1)
                with gr.Row(elem_classes=["racer-controls"]):
                    bench_btn = gr.Button("Run the benchmark", variant="primary", elem_id="bench-run")
                    bench_stop = gr.Button("Stop", variant="stop", elem_id="bench-stop", interactive=False)
                bench_queue = gr.Markdown(elem_id="bench-queue")
                bench_status = gr.Markdown(elem_id="bench-status")
                overall_md = gr.Markdown(elem_classes=["racer-table"])
                cat_md = gr.Markdown(elem_classes=["racer-table"])
                b_fig = gr.Plot(show_label=False, elem_classes=["racer-plot"], visible=False)
                acc_fig = gr.Plot(show_label=False, elem_classes=["racer-plot"], visible=False)
                lat_fig = gr.Plot(show_label=False, elem_classes=["racer-plot"], visible=False)
                tvt_fig = gr.Plot(show_label=False, elem_classes=["racer-plot"], visible=False)
                cost_fig = gr.Plot(show_label=False, elem_classes=["racer-plot"], elem_id="cost-plot", visible=False)
                cost_md = gr.Markdown(elem_classes=["racer-table"])
                files = gr.File(label="Report (markdown + summary.json)", file_count="multiple", interactive=False,
                                visible=False)

            # -- 4. How it works --------------------------------------------------------------------
            with gr.Tab("How it works", id="explain", elem_id="tab-explain") as tab_explain:
                gr.Markdown(X.INTRO)
                ex_intro = gr.Markdown("*Loading the preset runs…*", elem_id="explain-intro")
                gr.Markdown(X.TREE)
                ex_tree_s = gr.Markdown()
                ex_tree = gr.Plot(show_label=False, elem_classes=["racer-plot"], elem_id="explain-tree")
                ex_stages = []
                for key, intro in X.STAGE_INTROS.items():
                    gr.Markdown(intro)
                    ex_stages += [gr.Markdown(elem_id=f"explain-{key}-text"),
                                  gr.Plot(show_label=False, elem_classes=["racer-plot"], elem_id=f"explain-{key}")]
                gr.Markdown(X.SOURCES)
                ex_src = gr.Plot(show_label=False, elem_classes=["racer-plot"], elem_id="explain-src-win")
                ex_src2 = gr.Plot(show_label=False, elem_classes=["racer-plot"], elem_id="explain-src-cannot")
                gr.Markdown(X.COST)
                ex_cost = gr.Plot(show_label=False, elem_classes=["racer-plot"])
                gr.Markdown(X.LIMITS)
                ex_limits = gr.Markdown(elem_id="explain-limits")
                to_insp = gr.Button("Step through the first preset run in the Step inspector")

            # -- 5. Settings -------------------------------------------------------------------
            with gr.Tab("Settings", id="settings", elem_id="tab-settings"):
                settings_md = gr.Markdown()
                allowed = store.allowed
                s_model = gr.Dropdown(model_choices(allowed), value="default", label="Model",
                                      interactive=len(allowed) > 1,
                                      info="the models that ship with RACER Studio, and any others this server "
                                           "allows; another model loads on its first run")
                with gr.Row():
                    s_mode = gr.Radio(["auto", "fixed"], value=d.capacity_mode, label="Draft tree capacity",
                                      info="auto: sized every step from this machine's cost curve")
                    s_cap = gr.Slider(1, 128, value=d.capacity, step=1, label="Fixed capacity (nodes incl. root)",
                                      info="RACER and Token Recycling get the same size")
                with gr.Row():
                    s_acap = gr.Slider(64, lim.max_automaton, value=d.automaton_capacity, step=64,
                                       label="Automaton capacity (nodes)",
                                       info=f"this server allows up to {lim.max_automaton:,}")
                    s_win = gr.Slider(2, 32, value=d.window, step=1, label="n-gram window")
                with gr.Row():
                    s_topk = gr.Slider(1, 8, value=d.topk, step=1, label="Next tokens kept per copy-logit row (K)")
                    s_rule = gr.Radio(list(BREADTH_RULES), value=d.breadth_rule,
                                      label="How the logits tree widens (breadth rule)",
                                      info="paper: x0's best entry may grow 8 children; released: 4, as in the "
                                           "authors' code")
                    s_merge = gr.Radio(list(MERGE_CHOICES), value=d.merge, label="Merge strategy",
                                       info="merge: retrieval first, logits fill the rest; half: 50/50; "
                                            "hard: logits only when retrieval finds nothing")
                with gr.Row():
                    s_temp = gr.Slider(0.0, 2.0, value=d.temperature, step=0.05, label="Temperature (0 = greedy)")
                    s_topp = gr.Slider(0.05, 1.0, value=d.top_p, step=0.05, label="Top-p")
                    s_seed = gr.Number(value=d.seed, precision=0, label="Seed")
                s_max = gr.Slider(1, lim.max_new_tokens, value=d.max_new_tokens, step=1, label="Max new tokens",
                                  info=f"this server allows up to {lim.max_new_tokens}")
                s_reset = gr.Button("Restore defaults", size="sm")
        gr.Markdown("<small>RACER: retrieval-augmented, copy-logit speculative decoding (ACL 2026 Findings). "
                    "Each browser session keeps its own runs, chat and automata; nothing is shared between "
                    "users.</small>")

        s_model.change(studio.prompt_mode, s_model, prompt_note, api_name="prompt_mode", **light)
        settings = [s_model, s_mode, s_cap, s_acap, s_win, s_topk, s_rule, s_merge, s_temp, s_topp, s_seed, s_max]

        # -- wiring ----------------------------------------------------------------------------------
        status_timer.tick(studio.model_status, None, [model_md, status_timer], api_name=False, **light)
        demo.load(studio.model_status, None, [model_md, status_timer], api_name=False, **light)
        demo.load(studio.settings_info, None, [settings_md], api_name=False, **light)
        demo.load(None, None, [viewport], js="() => window.innerWidth", api_name=False)

        insp_outputs = [insp_header, slider, sentence, tree_plot, step_cost, auto_plot, rows_html, insp_text]
        step_outputs = [sentence, tree_plot, step_cost, auto_plot, rows_html, insp_text]
        anat_inputs = [sess, slider, stage, layer, viewport]
        anat_outputs = [stage_md, stage_plot, stage_plot2, stage_html, layer]
        wi_inputs = [sess, slider, wi_sources, wi_cap, wi_rule, viewport]
        wi_outputs = [wi_md, wi_plot, wi_bars, wi_table, why_md]
        tv = studio.traces

        # The anatomy and what-if views replay the run up to the step: only the view in sight
        # follows the slider (and is drawn when its tab opens).
        def when(view: str, fn: Any, n_out: int) -> Any:
            def gated(current: str, *args: Any) -> Any:
                return fn(*args) if current == view else (gr.skip(),) * n_out
            return gated

        def refresh_views(ev: Any) -> Any:
            """After the session's trace changed: the header, step 1, and the view in sight."""
            ev = ev.then(studio.inspector_refresh, [sess, viewport], insp_outputs, api_name=False, **light)
            ev = ev.then(when("anatomy", tv.anatomy_show, 5), [insp_view] + anat_inputs, anat_outputs,
                         api_name=False, **light)
            return ev.then(when("whatif", tv.what_if_show, 5), [insp_view] + wi_inputs, wi_outputs,
                           api_name=False, **light)

        # A decode button first asks the desk (light: it refuses a second decode of this session,
        # or queues a job whose Stop works while it waits, and starts the queue timer); only then
        # is the decode itself sent. API clients call the decode directly (the queue applies the
        # same one-per-session rule).
        desk = studio.desk
        queue_lines = [race_queue, chat_queue, bench_queue]
        queue_timer.tick(desk.queue_tick, [sess], queue_lines + [queue_timer], api_name="queue_status", **light)

        race_fn = on_gpu(duration=int(lim.time_limit_s) + 30)(studio.race)
        race_ev = run_btn.click(desk.admitter("race"), [sess], [race_status, run_btn, stop_btn, race_queue, queue_timer],
                                api_name=False, **light).success(
            race_fn, [sess, viewport, prompt, system] + settings + [repeat],
            [race_status] + lane_out + [race_plot, verdict, run_btn, stop_btn, sess],
            show_progress="minimal", api_name="race", **decode)
        refresh_views(race_ev)
        stop_btn.click(studio.stop, [sess], [race_status, run_btn, stop_btn],
                       cancels=[race_ev] if zero_gpu() else None, api_name="stop", **light)

        tab_insp.select(studio.inspector_refresh, [sess, viewport], insp_outputs, api_name="inspector", **light)
        slider.change(studio.inspector_show, [sess, slider, viewport], step_outputs, api_name="inspector_step", **light)
        slider.change(when("anatomy", tv.anatomy_show, 5), [insp_view] + anat_inputs, anat_outputs, api_name=False,
                      **light)
        slider.change(when("whatif", tv.what_if_show, 5), [insp_view] + wi_inputs, wi_outputs, api_name=False,
                      **light)
        prev_btn.click(lambda s, k: studio.inspector_move(s, k, -1), [sess, slider], [slider], api_name="prev", **light)
        next_btn.click(lambda s, k: studio.inspector_move(s, k, +1), [sess, slider], [slider], api_name="next", **light)
        play_btn.click(studio.inspector_play, [sess, slider, playing], [play_timer, play_btn, playing, slider], api_name=False, **light)
        play_timer.tick(studio.inspector_tick, [sess, slider], [slider, play_timer, play_btn, playing], api_name=False, **light)
        insp_text.select(studio.inspector_jump, [sess], [slider], api_name=False, **light)

        # The inspector's views: the step (overview), its anatomy, what if.
        view_overview.select(lambda: "overview", None, [insp_view], api_name=False, **light)
        view_anatomy.select(lambda: "anatomy", None, [insp_view], api_name=False, **light).then(
            tv.anatomy_show, anat_inputs, anat_outputs, api_name=False, **light)
        view_whatif.select(lambda: "whatif", None, [insp_view], api_name=False, **light).then(
            tv.what_if_show, wi_inputs, wi_outputs, api_name=False, **light)
        stage.change(tv.anatomy_show, anat_inputs, anat_outputs, api_name="anatomy", **light)
        layer.release(tv.anatomy_show, anat_inputs, anat_outputs, api_name=False, **light)
        stage_prev.click(lambda st: tv.stage_move(st, -1), [stage], [stage], api_name=False, **light)
        stage_next.click(lambda st: tv.stage_move(st, +1), [stage], [stage], api_name=False, **light)
        for c in (wi_sources, wi_cap, wi_rule):
            c.change(tv.what_if_show, wi_inputs, wi_outputs, api_name="what_if" if c is wi_sources else False,
                     **light)

        # Trace files: export, load, the shipped examples.
        trace_export.click(tv.export, [sess], [trace_file, trace_note], api_name="trace_export", **light)
        refresh_views(trace_up.upload(tv.load_file, [sess, trace_up], [sess, trace_note], api_name="trace_load",
                                      **light))
        refresh_views(trace_pick.input(tv.load_example, [sess, trace_pick], [sess, trace_note],
                                       api_name="trace_example", **light))

        chat_fn = on_gpu(duration=int(lim.time_limit_s) + 30)(studio.chat)
        chat_args = dict(fn=chat_fn, inputs=[sess, chat_in, system] + settings,
                         outputs=[chatbot, chat_in, chat_status, send_btn, sess, chat_stop], show_progress="minimal",
                         **decode)
        chat_admit = dict(fn=desk.admitter("chat"), inputs=[sess],
                          outputs=[chat_status, send_btn, chat_stop, chat_queue, queue_timer], api_name=False, **light)
        chat_send = send_btn.click(**chat_admit).success(api_name="chat", **chat_args)
        for ev in (chat_send, chat_in.submit(**chat_admit).success(api_name=False, **chat_args)):
            refresh_views(ev)
        chat_stop.click(studio.stop, [sess], [chat_status, send_btn, chat_stop], api_name=False, **light)
        reset_btn.click(studio.chat_reset, [sess], [chatbot, chat_status], api_name="chat_reset", **light)

        bench_fn = on_gpu(duration=int(lim.bench_time_limit_s) + 60)(studio.benchmark)
        bench_btn.click(desk.admitter("benchmark"), [sess], [bench_status, bench_btn, bench_stop, bench_queue, queue_timer],
                        api_name=False, **light).success(
            bench_fn, [sess, viewport, b_cat, b_n, b_max, b_methods, b_curve] + settings,
            [bench_status, overall_md, cat_md, b_fig, acc_fig, lat_fig, tvt_fig, cost_fig, cost_md, files,
             sess, bench_btn, bench_stop], api_name="benchmark", **decode)
        tab_bench.select(studio.bench_initial, [sess, viewport], [bench_status, overall_md, cat_md, b_fig, acc_fig, lat_fig,
                                                         tvt_fig, cost_fig, cost_md, files], api_name=False, **light)
        bench_stop.click(studio.stop, [sess], [bench_status, bench_btn, bench_stop], api_name=False, **light)

        # Light: the preset run behind these figures is made once, in the background after start-up.
        explain_fn = on_gpu(duration=60)(studio.explainer)
        tab_explain.select(explain_fn, [sess, viewport] + settings,
                           [ex_intro, ex_tree_s, ex_tree] + ex_stages + [ex_src, ex_src2, ex_cost, ex_limits],
                           api_name="explainer", **light)
        refresh_views(to_insp.click(studio.explainer_to_inspector, [sess], [sess, tabs], api_name=False, **light))

        def restore() -> list[Any]:
            return [d.model, d.capacity_mode, d.capacity, d.automaton_capacity, d.window, d.topk, d.breadth_rule,
                    d.merge, d.temperature, d.top_p, d.seed, d.max_new_tokens]
        s_reset.click(restore, None, settings, api_name=False, **light)

        # The tab closed or reloaded: its session's data, job and benchmark files go now.
        demo.unload(desk.session_closed)

    demo.queue(default_concurrency_limit=lim.decode_concurrency, max_size=lim.queue_size)
    desk.attach(demo, sess)
    demo.racer_studio = studio      # tests and scripts reach the desk and workspace through it
    return demo


def launch_kwargs() -> dict[str, Any]:
    """Arguments for `demo.launch` shared by `python app.py` and the tests (Gradio 6 takes the
    theme and CSS here)."""
    # show_error: a malformed API input (e.g. text for a number) gets Gradio's own message
    # ("Expected a `float`, but the value passed ... was 'lots'") instead of a bare "error";
    # the handlers themselves never raise (they report in the status line).
    return dict(css_paths=[str(ASSETS / "style.css")], theme=gr.themes.Soft(), ssr_mode=False,
                allowed_paths=[str(ASSETS)], footer_links=["api"], show_error=True)


def main() -> None:
    port = int(os.environ.get("PORT", os.environ.get("GRADIO_SERVER_PORT", "7860")))
    host = os.environ.get("HOST", os.environ.get("GRADIO_SERVER_NAME", "0.0.0.0"))
    demo = build_app()
    print(f"RACER Studio: http://localhost:{port}  (loading {os.environ.get('RACER_MODEL', 'the default model')}; "
          f"status at the top of the page)", flush=True)
    demo.launch(server_name=host, server_port=port, **launch_kwargs())


if __name__ == "__main__":
    main()
