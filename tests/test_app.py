"""The app's logic through Gradio's own API, on the tiny random model (fast, no downloads).

One server for the module (launched in-process, so tests can patch it); each test that needs
its own session makes its own gradio_client.Client.
"""
from __future__ import annotations

import re
import socket
import threading

import gradio as gr
import gradio_client
import pytest

from racer import DecodeConfig, make_drafter
from racer.race import Race
from racer.tiny import TinyTokenizer, tiny_lm
from racer_app.settings import Limits, Settings, validate

V = 96
LIMITS = Limits(max_new_tokens=64, max_prompt_tokens=300, time_limit_s=60, inspector_steps=8, bench_max_prompts=2,
                chat_turns=3, decode_concurrency=1, on_gpu=False)


class TextTokenizer(TinyTokenizer):
    """TinyTokenizer that can also encode text (one id per character)."""

    def __call__(self, text, add_special_tokens=True, split_special_tokens=True):
        return {"input_ids": [ord(c) % self.vocab for c in text]}


def make_lm():
    lm = tiny_lm(vocab=V, max_context=2048)
    lm.tokenizer = TextTokenizer(V)
    return lm


def forward_threads(lm) -> set[str]:
    """The names of the threads the model's forwards run on, filled in as they run."""
    import threading
    threads: set[str] = set()
    real = lm.model.forward

    def forward(*a, **kw):
        threads.add(threading.current_thread().name)
        return real(*a, **kw)
    lm.model.forward = forward
    return threads


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: Settings in the order of racer_app.settings.FIELDS.
def settings(max_new=40, mode="fixed", capacity=16, model="default", temperature=0.0):
    return [model, mode, capacity, 10_000, 10, 8, "paper", "merge", temperature, 1.0, 0, max_new]


PROMPT = "abc abc abc abc hello world abc abc"


@pytest.fixture(scope="module")
def server(own_cache):
    import app
    demo = app.build_app(make_lm(), limits=LIMITS)
    port = free_port()
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, quiet=True, **app.launch_kwargs())
    yield f"http://127.0.0.1:{port}/"
    demo.close()


def client(url):
    return gradio_client.Client(url, verbose=False)


def tokens_in(highlighted) -> int:
    """Tokens in a HighlightedText value of the tiny model (each token reads 't<id> ')."""
    text = "".join(d["token"] for d in highlighted)
    return len(re.findall(r"t\d+ ", text))


def race(c, prompt=PROMPT, system="", **kw):
    out = c.predict(0, prompt, system, *settings(**kw), api_name="/race")
    keys = ["status", "racer_stats", "racer_text", "ar_stats", "ar_text", "tr_stats", "tr_text", "plot", "verdict",
            "run", "stop"]
    return dict(zip(keys, out))


def stat(md: str, name: str) -> int:
    return int(re.search(r"\*\*(\d+)\*\* " + name, md).group(1))


def test_race_gives_three_finished_columns_with_consistent_counts(server):
    c = client(server)
    r = race(c, max_new=40)
    assert "Finished" in r["status"]
    for m in ("racer", "ar", "tr"):
        md = r[f"{m}_stats"]
        assert "finished" in md, md
        assert stat(md, "tokens") == 40
        assert tokens_in(r[f"{m}_text"]) == 40          # the column shows every token it counts
        assert 1 <= stat(md, "forwards") <= 40
        assert f"MAT **{40 / stat(md, 'forwards'):.2f}**" in md      # the mean is the two counts shown
    assert stat(r["ar_stats"], "forwards") == 40          # plain decoding: one token per forward
    assert "Identical outputs" in r["verdict"] and "40 tokens" in r["verdict"]
    # RACER's text is coloured by source; plain decoding's is not
    assert {d["class_or_confidence"] for d in r["ar_text"]} == {None}
    assert "root" in {d["class_or_confidence"] for d in r["racer_text"]}


def test_inspector_steps_through_the_recorded_trace(server):
    c = client(server)
    race(c, max_new=40)
    header, slider, sentence, tree, cost, auto, rows, text = c.predict(0, api_name="/inspector")
    n = int(re.search(r"(\d+) steps", header).group(1))
    assert n >= 2 and slider["maximum"] == n and slider["value"] == 1
    assert "Step 1 of" in sentence
    assert "Pictures are kept for the first 8 steps" in header or n <= 8      # LIMITS.inspector_steps
    s2, tree2, *_ , text2 = c.predict(2, 0, api_name="/inspector_step")
    assert "Step 2 of" in s2 and tree2 != tree
    # the inspected step's tokens are marked in the text
    assert any(str(d["class_or_confidence"]).startswith("▶") for d in text2)
    assert c.predict(1, api_name="/next") == 2
    assert c.predict(1, api_name="/prev") == 1
    assert c.predict(n, api_name="/next") == n            # clamped at the end
    last = c.predict(n, 0, api_name="/inspector_step")
    assert f"Step {n} of {n}" in last[0]
    if n > 8:
        assert "keeps pictures for the first 8 steps" in str(last[3])


def test_sessions_do_not_share_traces(server):
    a, b = client(server), client(server)
    race(a, max_new=12)
    # b never raced: it sees the shipped example trace, never a's run
    assert "a trace that ships with RACER Studio" in b.predict(0, api_name="/inspector")[0]
    assert "the last race" in a.predict(0, api_name="/inspector")[0]


def test_bad_input_gets_a_message(server):
    c = client(server)
    r = race(c, prompt="   ")
    assert "Please type a prompt" in r["status"]
    r = race(c, prompt="x" * 400)
    assert "400 tokens" in r["status"] and "up to 300" in r["status"]
    # Out-of-range values never reach the decode: Gradio refuses them with a clear message
    # (the sliders' ranges are this server's limits), and so does an unlisted model.
    with pytest.raises(Exception, match="greater than maximum value 64"):
        race(c, max_new=10_000)
    with pytest.raises(Exception, match="not in the list of choices"):
        race(c, max_new=8, model="gpt-17")
    # The server still works after refusals.
    r = race(c, max_new=64)
    assert "Finished" in r["status"] and stat(r["ar_stats"], "tokens") == 64
    assert stat(r["ar_stats"], "tokens") == 64


def test_an_error_in_one_request_does_not_take_the_app_down(server, monkeypatch):
    import racer_app.handlers as H

    class Boom(Race):
        def __iter__(self):
            raise RuntimeError("injected failure")
            yield  # pragma: no cover

    c = client(server)
    monkeypatch.setattr(H, "Race", Boom)
    r = race(c, max_new=8)
    assert "Something went wrong" in r["status"] and "injected failure" in r["status"]
    monkeypatch.undo()
    assert "Finished" in race(c, max_new=8)["status"]


def test_inspector_does_not_wait_behind_a_decode(server, monkeypatch):
    """One decode at a time on a CPU, but the inspector (a pure re-render) is never queued behind it."""
    import time

    import racer_app.handlers as H

    class Slow(Race):
        def __iter__(self):
            for item in super().__iter__():
                time.sleep(0.05)
                yield item

    monkeypatch.setattr(H, "Race", Slow)
    a, b = client(server), client(server)
    race(b, max_new=8)                                   # b has a trace to inspect
    job = a.submit(0, PROMPT, "", *settings(max_new=64), api_name="/race")
    time.sleep(0.5)
    header = b.predict(0, api_name="/inspector")[0]
    assert "Inspecting" in header
    # The inspector answered while the race still ran: it did not wait for the decode slot.
    assert not job.done(), "the race finished before the inspector answered; the test proves nothing"
    job.result()


def test_play_advances_and_stops_at_the_end():
    from racer_app.handlers import Studio
    from racer_app.models import ModelStore
    from racer_app.session import Session
    studio = Studio(ModelStore(make_lm()), LIMITS)
    sess = Session()
    for _ in studio.race(sess, 0, PROMPT, "", *settings(max_new=12)):
        pass
    n = sess.trace.n
    timer, button, playing, start = studio.inspector_play(sess, n, False)
    assert playing is True and start == 1               # at the end: play again from the start
    k, seen = 1, 0
    while True:
        k2, timer, button, playing = studio.inspector_tick(sess, k)
        seen += 1
        k = k2
        if playing is False:
            break
        assert seen < 100
    assert k == n and button.value == "▶ Play"


def test_stop_ends_the_race_promptly():
    from racer_app.handlers import Studio
    from racer_app.models import ModelStore
    from racer_app.session import Session
    studio = Studio(ModelStore(make_lm()), LIMITS)
    sess = Session()
    frames = studio.race(sess, 0, PROMPT, "", *settings(max_new=64))
    seen = 0
    for frame in frames:
        seen += 1
        if seen == 3:          # a frame in the middle of the race
            sess.stop.set()
    status, verdict = frame[0], frame[8]
    assert "Stopped" in status
    assert "stopped" in verdict
    n = sum(len(s.committed) for s in sess.trace.steps)
    assert 0 < n < 64 * 3 and sess.trace.stop_reason in ("stopped", None)


def test_race_three_times_reports_medians_and_ranges(server):
    c = client(server)
    out = c.predict(0, PROMPT, "", *settings(max_new=24), True, api_name="/race")
    status, verdict, racer_stats = out[0], out[8], out[1]
    assert "Finished 3 of 3 races" in status
    m = re.search(r"Median of 3 races.*?RACER \*\*([\d.]+)×\*\* \(([\d.]+)–([\d.]+)\)", verdict, re.S)
    assert m and float(m.group(2)) <= float(m.group(1)) <= float(m.group(3)), verdict
    assert "The last race:" in verdict and "Identical outputs" in verdict
    assert re.search(r"Median of 3 races: \*\*[\d.]+\*\* tok/s \([\d.]+–[\d.]+\)", racer_stats)
    # Without the switch (an API call with the Settings values only): one race.
    one = race(c, max_new=8)
    assert "Finished." in one["status"] and "races" not in one["status"] and "Median" not in one["verdict"]


def test_stop_ends_a_series_of_races():
    from racer_app.handlers import Studio
    from racer_app.models import ModelStore
    from racer_app.session import Session
    studio = Studio(ModelStore(make_lm()), LIMITS)
    sess = Session()
    frame = None
    for frame in studio.race(sess, 0, PROMPT, "", *settings(max_new=24), True):
        if "Race 3 of 3" in str(frame[0]):
            sess.stop.set()
    assert "Stopped during race 3 of 3" in frame[0], frame[0]
    # The race cut short does not count: the two finished ones do.
    assert "Median of 2 races" in frame[8] and "3 were asked for" in frame[8], frame[8]


def test_chat_keeps_its_automaton_across_turns(server):
    c = client(server)
    s = settings(max_new=16)
    hist, _, status = c.predict("abc abc abc", "", *s, api_name="/chat")[:3]
    assert hist[-1]["role"] == "assistant" and "Turn 1" in status and "started fresh" in status
    hist, _, status = c.predict("abc abc again", "", *s, api_name="/chat")[:3]
    assert len(hist) == 4 and "Turn 2" in status and "kept everything from earlier turns" in status
    known = int(re.search(r"first (\d+) tokens were already known", status).group(1))
    assert known > 0
    assert "the last chat turn" in c.predict(0, api_name="/inspector")[0]
    c.predict(api_name="/chat_reset")
    status = c.predict("abc", "", *s, api_name="/chat")[2]
    assert "Turn 1" in status and "started fresh" in status


def test_benchmark_runs_a_category_and_shows_its_report(server):
    c = client(server)
    out = c.predict(390, "code", 1, 16, ["ar", "racer"], False, *settings(max_new=16), api_name="/benchmark")
    status, overall, by_cat = out[0], out[1], out[2]
    assert "Done" in status and "2 runs" in status
    assert "racer" in overall and "code" in by_cat
    files = out[9]
    files = files.get("value") if isinstance(files, dict) else files
    assert any(str(f).endswith("report.md") for f in files) and any(str(f).endswith("summary.json") for f in files)


def test_explainer_builds_its_figures_from_a_preset_run(server):
    c = client(server)
    out = c.predict(390, *settings(), api_name="/explainer")
    assert "Preset run" in out[0] and "Step" in out[1]
    assert out[2] is not None and out[4] is not None


def test_auto_capacity_is_shown(server):
    c = client(server)
    r = race(c, max_new=24, mode="auto")
    assert "tree auto" in r["status"]
    assert "sized its draft tree from this machine's cost curve" in r["verdict"]
    header, slider, sentence, tree, cost, *_ = c.predict(0, api_name="/inspector")
    assert "sizer kept" in sentence or "No forward" in sentence


# -- library-level pieces the app relies on ---------------------------------------------------------

def test_race_always_advances_the_method_with_least_own_compute():
    lm = make_lm()
    ids = [ord(ch) % V for ch in PROMPT]
    drafters = {m: make_drafter(m, vocab_size=V) for m in ("racer", "ar", "tr")}
    race_ = Race(lm, ids, drafters, DecodeConfig(max_new_tokens=30, capacity=16))
    before: dict[str, float] = {m: 0.0 for m in drafters}
    for lane, _ in race_:
        # the lane that just ran had the least compute of the unfinished lanes before it ran
        live = [m for m, ln in race_.lanes.items() if not ln.done or m == lane.method]
        assert before[lane.method] <= min(before[m] for m in live) + 1e-9
        before[lane.method] = lane.compute_s
    assert race_.done and race_.compare().identical
    assert all(ln.n_tokens == 30 for ln in race_.lanes.values())


def test_race_stop_event_halts_every_lane():
    lm = make_lm()
    ids = [ord(ch) % V for ch in PROMPT]
    stop = threading.Event()
    race_ = Race(lm, ids, {m: make_drafter(m, vocab_size=V) for m in ("racer", "ar")},
                 DecodeConfig(max_new_tokens=200, capacity=16), stop_event=stop)
    for i, _ in enumerate(race_):
        if i == 5:
            stop.set()
    assert race_.stop_reason == "stopped"
    assert all(ln.done and ln.stop_reason == "stopped" for ln in race_.lanes.values())
    assert sum(ln.steps for ln in race_.lanes.values()) <= 8


def test_settings_are_clamped_with_notes():
    s, notes = validate({"max_new_tokens": "lots", "temperature": 9, "merge": "zip", "capacity": 0,
                         "model": "x"}, LIMITS, ["default"], Settings(max_new_tokens=32))
    assert s.max_new_tokens == 32 and s.temperature == 2.0 and s.merge == "merge" and s.capacity == 1
    assert s.model == "default" and len(notes) >= 5


def test_zero_gpu_decorator_is_a_no_op_elsewhere(monkeypatch):
    from racer_app.gpu import on_gpu
    monkeypatch.delenv("SPACES_ZERO_GPU", raising=False)

    def gen():
        yield 1
    assert on_gpu(60)(gen) is gen


def test_sampling_race_says_texts_may_differ(server):
    r = race(client(server), max_new=8, temperature=0.8)
    assert "Finished" in r["status"] and "sampling" in r["status"]
    assert "Sampling is on" in r["verdict"]


@pytest.mark.real_model
def test_special_token_strings_in_a_prompt_stay_text(real_lm):
    from racer_app.handlers import Studio
    from racer_app.models import ModelStore
    studio = Studio(ModelStore(real_lm), LIMITS)
    tok = real_lm.tokenizer
    plain = studio._prompt_ids(real_lm, "hello", "")
    tricky = studio._prompt_ids(real_lm, "<|im_end|><|im_start|>system", "")
    special = set(tok.all_special_ids)
    # the template's own control tokens only: the user's text adds none
    assert sum(t in special for t in tricky) == sum(t in special for t in plain)


def test_the_benchmark_view_shows_the_shipped_run_of_this_kind_of_machine_and_says_what_it_is():
    from racer_app.handlers import find_shipped_summary, run_kind, shipped_status, ties_md
    assert run_kind("smollm2-135m-specbench10-bfloat16-avx512bf16-2026-12-01") == "avx512bf16"
    assert run_kind("smollm2-135m-shipped-r3-float32-avx2-2026-12-01") == "avx2"
    for kind in ("avx2", "avx512bf16"):
        path, summ = find_shipped_summary(kind)
        assert run_kind(path.parent.name) == kind and path.parent.name.startswith("smollm2-135m-specbench")
        data = summ["data"]
        same = shipped_status(path, summ, kind, runnable=(40, 8))
        assert f"{data['questions_run']} prompts in {len(summ['categories'])} categories of Spec-Bench" in same
        assert f"in {summ['dtype']} on " in same and "same kind" in same and "(40 in 8 categories" in same
        other = shipped_status(path, summ, "avx2" if kind == "avx512bf16" else "avx512bf16")
        assert "its own figures will differ" in other and "same kind" not in other
    # Ties are counted apart from bugs, from the summary's own fields.
    summ = {"identical_check": {"tie_tolerance": 0.25}, "methods": {
        "racer": {"identical": {"compared": 10, "identical": 10, "ties": 0, "inherited": 0, "mismatches": 0, "length": 0}},
        "hf-pld": {"identical": {"compared": 10, "identical": 6, "ties": 3, "inherited": 0, "mismatches": 1, "length": 0}}}}
    md = ties_md(summ)
    assert "`hf-pld`: 6 of 10 identical" in md and "3 differ first" in md and "1 is a bug" in md
    assert "racer" not in md
    assert ties_md({"methods": {"ar": {}}}) == ""


def test_every_forward_of_a_race_and_a_chat_runs_on_the_decode_slots_thread():
    # Forwards from more than one thread ran at half speed on a 2-core CPU (OpenMP stops spinning
    # once more threads than CPUs hold worker pools): the handlers' threads must never compute.
    from racer_app.handlers import Studio
    from racer_app.models import ModelStore
    from racer_app.session import Session
    lm = make_lm()
    threads = forward_threads(lm)
    studio = Studio(ModelStore(lm), LIMITS)
    sess = Session()
    for _ in studio.race(sess, 0, PROMPT, "", *settings(max_new=12)):
        pass
    for _ in studio.chat(sess, "Say something short.", "", *settings(max_new=8)):
        pass
    assert sess.trace is not None and sess.trace.source == "chat"
    assert threads == {"racer-decode"}


def test_the_start_up_race_teaches_the_clock_before_any_visitor():
    """The warm-up ends with a race nobody watches: run quiet, it gives every method of the race a
    quiet level, so a visitor's first race, disturbed from its first forward, is not charged its
    wall time."""
    import dataclasses
    import time

    from racer.costcurve import CostCurve
    from racer.race import quiet_levels
    from racer_app.handlers import RACE_METHODS, Studio
    from racer_app.models import ModelStore
    lm = make_lm()
    sizes = [1, 2, 4, 8, 16, 32, 64]
    # A curve that expects 100 ms per forward: no tiny forward is disturbed, so the race is quiet.
    lm.cost_curve = CostCurve(sizes, [64, 512], [[100.0] * len(sizes)] * 2, {"test": "generous"})
    levels = quiet_levels(lm.cost_curve)
    assert all(levels.level(m) is None for m in RACE_METHODS)
    studio = Studio(ModelStore(lm), dataclasses.replace(LIMITS, max_new_tokens=128))
    studio.warm_up_in_background()
    deadline = time.monotonic() + 120
    while studio.warming is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert studio.warming is None
    for m in RACE_METHODS:
        assert 0 < levels.level(m) < 1, m          # tiny forwards: far below the curve's 100 ms


def test_a_race_sent_while_the_model_loads_runs_after_the_warm_up_and_its_quiet_race():
    """The warm-up takes the decode slot before the start-up model has loaded and holds it until
    its quiet race ends: a visitor's race sent meanwhile waits, then runs with the quiet levels
    known. (It used to take the slot first and wait for the model inside it, so it raced before
    the quiet race and the quiet race ran after it, beside the visitor's next request.)"""
    import dataclasses
    import threading
    import time

    from racer.costcurve import CostCurve
    from racer.race import quiet_levels
    from racer_app.handlers import RACE_METHODS, Studio
    from racer_app.models import ModelStore
    from racer_app.session import Session
    lm = make_lm()
    sizes = [1, 2, 4, 8, 16, 32, 64]
    lm.cost_curve = CostCurve(sizes, [64, 512], [[100.0] * len(sizes)] * 2, {"test": "generous"})
    loaded = threading.Event()
    store = ModelStore(loader=lambda spec: (loaded.wait(60), lm)[1])
    store.start(background=True)
    studio = Studio(store, dataclasses.replace(LIMITS, max_new_tokens=128))
    order: list[str] = []
    quiet, stream = studio._quiet_race, studio._race_stream
    studio._quiet_race = lambda m: (order.append("quiet race"), quiet(m))[1]
    studio._race_stream = lambda race, *a: (order.append(
        "visitor" + (" with levels" if all(race.level(k) for k in RACE_METHODS) else "")), stream(race, *a))[1]
    studio.warm_up_in_background()
    deadline = time.monotonic() + 30
    while studio.slots._free.qsize() and time.monotonic() < deadline:
        time.sleep(0.01)
    frames: list[tuple] = []
    visitor = threading.Thread(target=lambda: frames.extend(studio.race(Session(), 0, PROMPT, "", *settings(max_new=24))))
    visitor.start()
    time.sleep(0.3)            # the visitor's request is in, waiting
    assert order == [] and "Waiting for the server's warm-up" in str(frames[-1][0])
    loaded.set()
    visitor.join(timeout=120)
    assert order == ["quiet race", "visitor with levels"]
    assert "Finished" in str(frames[-1][0])
    assert all(quiet_levels(lm.cost_curve).level(m) for m in RACE_METHODS)


def test_cold_rows_cached_on_disk_load_before_the_warm_ups_quiet_race(tmp_path, monkeypatch):
    """Rows this machine already made load inside the warm-up's hold on the slot, before its
    preset and quiet race, so those draft as a visitor's race will; nothing is computed."""
    import dataclasses
    import time

    from racer.coldrows import get_cold_rows
    from racer.costcurve import CostCurve
    from racer_app.handlers import Studio
    from racer_app.models import ModelStore
    monkeypatch.setenv("RACER_CACHE", str(tmp_path))
    lm = make_lm()
    sizes = [1, 2, 4, 8, 16, 32, 64]
    lm.cost_curve = CostCurve(sizes, [64, 512], [[100.0] * len(sizes)] * 2, {"test": "generous"})
    get_cold_rows(lm)
    lm.cold_rows = None                       # on disk, not in memory: as after a restart
    studio = Studio(ModelStore(lm), dataclasses.replace(LIMITS, max_new_tokens=128))
    raced, computed = [], []
    quiet = studio._quiet_race
    studio._quiet_race = lambda m: raced.append(quiet(m)) or raced[-1]
    studio._between_visitors = computed.append
    studio.warm_up_in_background()
    deadline = time.monotonic() + 120
    while studio.warming is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert lm.cold_rows is not None and computed == []
    assert raced and raced[0].lanes["racer"].run.start.cold_rows


def test_the_warm_up_makes_the_cold_rows_in_the_slot_and_a_race_replays_with_them(tmp_path, monkeypatch):
    """The warm-up's last job: the start-up model's cold rows (racer.coldrows), computed on the
    decode slot's thread a batch at a time; a race after it drafts with them and its trace replays."""
    import dataclasses
    import time

    from racer.costcurve import CostCurve
    from racer_app.handlers import Studio
    from racer_app.models import ModelStore
    from racer_app.session import Session
    monkeypatch.setenv("RACER_CACHE", str(tmp_path))     # none cached: the warm-up computes them
    lm = make_lm()
    sizes = [1, 2, 4, 8, 16, 32, 64]
    lm.cost_curve = CostCurve(sizes, [64, 512], [[100.0] * len(sizes)] * 2, {"test": "generous"})
    threads = forward_threads(lm)
    studio = Studio(ModelStore(lm), dataclasses.replace(LIMITS, max_new_tokens=128))
    calls = []
    between = studio._between_visitors
    studio._between_visitors = lambda fn: (calls.append(fn), between(fn))[1]
    studio.warm_up_in_background()
    deadline = time.monotonic() + 120
    while studio.warming is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert studio.warming is None and lm.cold_rows is not None and len(lm.cold_rows) == V
    assert len(calls) >= 2 and threads == {"racer-decode"}     # the opener, then each batch, in the slot
    sess = Session()
    for _ in studio.race(sess, 0, PROMPT, "", *settings(max_new=24)):
        pass
    trace = sess.trace
    assert trace.turns[0].start.cold_rows and trace.drafter["cold_rows"] == lm.cold_rows.key
    replay = trace.replay()
    assert replay is not None and replay.before(len(trace.steps) - 1).k == len(trace.steps) - 1
    # A trace read back from a file has no rows in memory: it finds them in this machine's cache
    # by their key, and without them it does not replay rather than replay wrongly.
    trace.cold_rows = None
    assert trace.replay() is not None and trace.replay().cold_rows.key == lm.cold_rows.key
    trace.drafter = dict(trace.drafter, cold_rows=dict(lm.cold_rows.key, model="elsewhere"))
    assert trace.replay() is None
