"""The inspector's anatomy, what-if and trace files through Gradio's API (tiny random model),
and a server whose model cannot be loaded still teaching from the shipped traces."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from racer.models import ModelLoadError
from racer_app import anatomy_view
from racer_app.models import ModelStore
from tests.test_app import LIMITS, PROMPT, client, free_port, make_lm, race

STAGE_HEADS = ("1 ·", "2 ·", "3 ·", "4 ·", "5 ·", "6 ·", "7 ·")


def launch(**kw):
    import app
    demo = app.build_app(limits=LIMITS, **kw)
    port = free_port()
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, quiet=True, **app.launch_kwargs())
    return demo, f"http://127.0.0.1:{port}/"


@pytest.fixture(scope="module")
def server(own_cache):
    demo, url = launch(lm=make_lm())
    yield url
    demo.close()


def anatomy(c, k, stage, layer=8):
    return c.predict(k, stage, layer, 0, api_name="/anatomy")


def test_every_stage_of_a_raced_step(server):
    c = client(server)
    race(c, max_new=40)
    header = c.predict(0, api_name="/inspector")[0]
    n = int(re.search(r"(\d+) steps", header).group(1))
    for k in (1, min(3, n)):
        for stage, head in zip(("match", "retrieval", "logits", "merge", "attention", "verify", "update"), STAGE_HEADS):
            words, fig, fig2, table, layer = anatomy(c, k, stage)
            assert words.startswith(f"#### {head}"), words[:80]
            assert "could not" not in words
            assert fig is not None


def test_what_if_answers_and_lists_every_variant(server):
    c = client(server)
    race(c, max_new=40)
    c.predict(0, api_name="/inspector")
    text, fig, bars, table, why = c.predict(1, ["retrieval", "logits", "lookup"], "8", "paper", 0, api_name="/what_if")
    assert "a tree of" in text and "would have committed" in text
    assert table.count("\n|") >= 8           # the run's own draft and seven variants
    assert "the run's size" in table and "without retrieval" in table and "64 nodes" in table
    assert "missed" in why or "Nothing was missed" in why
    text2 = c.predict(1, [], "the run's", "paper", 0, api_name="/what_if")[0]
    assert "without retrieval and logits and lookup" in text2


def test_export_and_load_a_trace(server, tmp_path):
    c = client(server)
    race(c, max_new=30)
    c.predict(0, api_name="/inspector")
    file, note = c.predict(api_name="/trace_export")
    assert "Exported" in note
    path = Path(file["value"] if isinstance(file, dict) and "value" in file else file)
    local = tmp_path / "mine.json.gz"
    shutil.copy(path, local)
    # A fresh visitor loads it: it replaces their (example) trace and replays
    c2 = client(server)
    import gradio_client
    note2 = c2.predict(gradio_client.handle_file(str(local)), api_name="/trace_load")
    assert "Loaded" in str(note2)
    header = c2.predict(0, api_name="/inspector")[0]
    assert "a loaded trace" in header
    assert anatomy(c2, 1, "verify")[0].startswith("#### 6 ·")


def test_a_bad_trace_file_is_refused_and_nothing_breaks(server, tmp_path):
    c = client(server)
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "something else"}')
    import gradio_client
    note = c.predict(gradio_client.handle_file(str(bad)), api_name="/trace_load")
    assert "Not loaded" in str(note) and "not a RACER Studio trace" in str(note)
    header = c.predict(0, api_name="/inspector")[0]
    assert "example" in header       # the session's trace was not replaced


def test_without_a_model_the_inspector_and_the_explainer_teach_from_shipped_traces(own_cache):
    def fail(spec):
        raise ModelLoadError("no model here (test)")
    store = ModelStore(loader=fail)
    store.start(background=False)
    demo, url = launch(store=store)
    try:
        c = client(url)
        header = c.predict(0, api_name="/inspector")[0]
        assert "No model could be loaded" in header and "example" in header
        assert anatomy(c, 1, "match")[0].startswith("#### 1 ·")
        out = c.predict(0, *(["default", "auto", 16, 10_000, 10, 8, "paper", "merge", 0.0, 1.0, 0, 40]),
                        api_name="/explainer")
        assert "example traces that ship" in out[0]
        race_out = c.predict(0, PROMPT, "", *(["default", "fixed", 16, 10_000, 10, 8, "paper", "merge", 0.0, 1.0, 0,
                                               20]), api_name="/race")
        assert "could not be loaded" in race_out[0]
    finally:
        demo.close()


def test_anatomy_is_cached_per_step_and_replays_for_a_new_one(server):
    from racer_app.session import Session
    from racer_app.tracefile import load, shipped
    sess = Session()
    sess.trace = load(shipped()[0][1])
    a1 = anatomy_view.step_anatomy(sess, sess.trace, 2)
    assert anatomy_view.step_anatomy(sess, sess.trace, 2) is a1
    a2 = anatomy_view.step_anatomy(sess, sess.trace, 3)
    assert a2 is not a1 and a2.data["step"] == 3 and a2.replay_ms > 0
