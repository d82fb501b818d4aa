"""The benchmark harness on the tiny model: output schemas, interleaving, row selection,
multi-turn conversations, identical-output accounting (and that a planted bug is caught),
skips, sampling, Ctrl-C."""
import json
import re
import zlib

import pytest
import torch

from racer import DecodeConfig
from racer.costcurve import CostCurve
from racer.bench import BenchSettings, HFMethod, LoopMethod, Row, load_rows, run_benchmark, run_rows
from racer.bench.__main__ import parse_args
from racer.bench.runner import parse_capacity
from racer.bench.data import DEFAULT_DATA, read_rows
from racer.bench.methods import Conversation, clip_lengths, clip_output, get_method
from racer.bench.summary import compare_outputs, first_difference, next_logits
from racer.drafters.base import Drafter
from racer.tree import DraftTree
from racer.tiny import tiny_lm
from visuals.bench_figures import bench_figures

V = 96
ROLE = {"system": 1, "user": 2, "assistant": 3}


def encode(messages):
    """Prompt builder for the tiny model (its tokenizer has no text side): 't12' -> id 12, other
    words hashed, a role marker before each message and an assistant opener at the end."""
    ids = []
    for m in messages:
        ids.append(ROLE[m["role"]])
        for w in m["content"].split():
            hit = re.fullmatch(r"t(\d+)", w)
            ids.append(int(hit.group(1)) if hit else 8 + zlib.crc32(w.encode()) % (V - 8))
    return ids + [ROLE["assistant"]]


ROWS = [
    Row("q1", "copy", ["alpha beta gamma delta alpha beta gamma delta alpha beta gamma"]),
    Row("q2", "chat", ["one two three four one two three four", "now say it again please"]),
    Row("q3", "copy", ["red green blue red green blue red green"]),
]
FAST = dict(max_new_tokens=16, capacity=16, warmup=1, warmup_tokens=4)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # The tiny model is all overhead: on a busy machine two threads fight and run ~50x slower.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def lm():
    return tiny_lm(vocab=V)


@pytest.fixture(scope="module")
def full_run(lm, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    methods = ["ar", "pld", "tr", "racer", "racer-retrieval", "racer-logits", "racer-half", "racer-hard", "hf", "hf-pld"]
    res = run_benchmark(lm, ROWS, methods, BenchSettings(**FAST), out_dir=out, encode=encode, figures=bench_figures,
                        images=False, progress=False, command="pytest", data={"path": "inline"})
    return res, out, methods


# -- outputs ---------------------------------------------------------------------------------

RESULT_KEYS = {"question_id", "category", "method", "turn", "prompt_len", "new_tokens", "steps", "forwards", "mat", "wall_s",
               "tokens_per_s", "prefill_ms", "stop_reason", "accept_lengths", "token_ids", "text", "timings",
               "step_ms", "elapsed_ms", "tree_sizes", "repeats_wall_s", "repeats_prefill_ms", "repeats_identical",
               "seq"}


def test_results_jsonl_schema(full_run):
    res, out, methods = full_run
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 4 * len(methods)  # q1, q2 t1, q2 t2, q3
    assert rows == res.results
    for r in rows:
        assert set(r) == RESULT_KEYS
        assert r["new_tokens"] == len(r["token_ids"]) <= 16
        assert all(isinstance(t, int) for t in r["token_ids"])
        assert r["wall_s"] > 0 and r["turn"] in (1, 2)
        if r["method"] == "hf-pld" or r["method"] == "hf":
            assert r["step_ms"] is None and r["timings"].keys() == {"generate_ms"}
        else:
            assert set(r["step_ms"]) >= {"draft", "forward", "update"}
            assert all(len(v) == r["steps"] for v in r["step_ms"].values())
            assert len(r["tree_sizes"]) == r["steps"]
        if r["steps"] is not None:
            assert sum(r["accept_lengths"]) == r["new_tokens"] and len(r["accept_lengths"]) == r["steps"]
            assert len(r["elapsed_ms"]) == r["steps"]
            assert r["elapsed_ms"] == sorted(r["elapsed_ms"]) and r["elapsed_ms"][-1] <= r["wall_s"] * 1e3
    hf = [r for r in rows if r["method"] == "hf"]
    assert all(r["steps"] == r["new_tokens"] and set(r["accept_lengths"]) == {1} for r in hf)
    # MAT: tokens per verification forward (the prefill's counted), exactly 1 for plain decoding.
    assert all(r["mat"] == round(r["new_tokens"] / r["forwards"], 4) for r in rows if r["forwards"])
    assert all(r["mat"] == 1.0 for r in rows if r["method"] in ("ar", "hf"))


def test_summary_schema(full_run):
    res, out, methods = full_run
    s = json.loads((out / "summary.json").read_text())
    assert s["format"] == "racer-bench/1" and s["command"] == "pytest"
    assert list(s["methods"]) == methods
    assert s["categories"] == ["copy", "chat"]
    for key in ("machine", "device", "dtype", "model", "settings", "hardware", "cost_curve", "tokens_vs_time"):
        assert s[key], key
    assert {"torch", "transformers"} <= set(s["machine"]["versions"])
    assert s["settings"]["capacity"] == 16 and s["settings"]["greedy"] is True
    for m in methods:
        d = s["methods"][m]
        o = d["overall"]
        for key in ("mat", "tokens_per_s", "speedup_vs_ar", "speedup_vs_hf", "identical_to_ar", "wall_s", "turns"):
            assert key in o, (m, key)
        assert o["turns"] == 4 and o["identical_to_ar"] == 4
        assert set(d["categories"]) == {"copy", "chat"}
        assert d["categories"]["chat"]["turns"] == 2
        assert sum(d["accept_hist"].values()) == o["steps"]
        if m not in ("hf", "hf-pld"):
            for key in ("draft_ms", "forward_ms", "update_ms", "tree_nodes"):
                assert o[key] is not None, (m, key)
    assert s["methods"]["ar"]["overall"]["mat"] == 1.0 and s["methods"]["ar"]["overall"]["speedup_vs_ar"] == 1.0
    assert s["methods"]["hf"]["overall"]["speedup_vs_hf"] == 1.0
    assert s["identical_check"]["ok"] is True
    # Speedup = throughput ratio; identical outputs make it the ratio of total times.
    ar, racer = s["methods"]["ar"]["overall"], s["methods"]["racer"]["overall"]
    assert racer["speedup_vs_ar"] == pytest.approx(ar["wall_s"] / racer["wall_s"], rel=1e-3)
    # Without the prefill: the ratio of the decoding times alone (each turn's wall less its prefill).
    decoding = {m: o["wall_s"] - o["turns"] * o["prefill_ms"] / 1e3 for m, o in (("ar", ar), ("racer", racer))}
    assert racer["decode_speedup_vs_ar"] == pytest.approx(decoding["ar"] / decoding["racer"], rel=1e-3)
    assert ar["decode_speedup_vs_ar"] == 1.0
    assert racer["decode_speedup_vs_ar"] != racer["speedup_vs_ar"]
    cc = s["cost_curve"]
    assert cc["sizes"] == [1, 2, 4, 8, 16, 32, 64] and len(cc["ms"]) == 7 and len(cc["grid"]) == len(cc["contexts"])
    tvt = s["tokens_vs_time"]
    assert tvt["turns"] == 4 and set(tvt["methods"]) == set(methods)
    assert tvt["methods"]["ar"]["points"][-1][1] == ar["new_tokens"]


def test_report_md(full_run):
    res, out, methods = full_run
    md = (out / "report.md").read_text()
    assert "## Overall" in md and "## Per category" in md and "## Identical outputs" in md
    for m in methods:
        assert f"`{m}`" in md
    for name in ("benchmark", "acceptance", "latency", "tokens_vs_time", "cost_curve"):
        assert (out / "plots" / f"{name}.html").is_file(), name
        assert f"plots/{name}.html" in md
    assert (out / "plots" / "plotly.min.js").is_file()  # the HTML plots work offline
    assert "--no-images" in md  # says why there are no PNGs


# -- schedule, selection, turns ----------------------------------------------------------------

class Spy(LoopMethod):
    """A loop method that logs each call (method, prompt) into a shared list."""

    def __init__(self, name, log):
        super().__init__(name if name in ("ar", "pld", "racer") else "ar")
        self.name, self.log = name, log

    def conversation(self, lm):
        inner = super().conversation(lm)
        spy = self

        class S(Conversation):
            def run(self, ids, cfg):
                out = inner.run(ids, cfg)
                spy.log.append((spy.name, list(ids), out))
                return out
        return S()


def test_methods_interleave_per_question_and_repeat(lm):
    log = []
    methods = [Spy("ar", log), Spy("pld", log), Spy("racer", log)]
    run = run_rows(lm, ROWS[:1] + ROWS[2:], methods, BenchSettings(**{**FAST, "repeats": 2, "warmup": 0}),
                   encode=encode, progress=False)
    assert [name for name, _, _ in log] == ["ar", "pld", "racer"] * 4   # A B C A B C, per question
    assert [r["seq"] for r in run.results] == [[0, 3], [1, 4], [2, 5], [6, 9], [7, 10], [8, 11]]
    for r in run.results:
        assert len(r["repeats_wall_s"]) == len(r["repeats_prefill_ms"]) == 2 and r["repeats_identical"] is True
        assert r["repeats_prefill_ms"][0] == r["prefill_ms"] and all(0 < p < 1e3 * w for p, w in
                                                                     zip(r["repeats_prefill_ms"], r["repeats_wall_s"]))
        assert r["wall_s"] == pytest.approx(sorted(r["repeats_wall_s"])[0] / 2 + sorted(r["repeats_wall_s"])[1] / 2,
                                            abs=2e-6)


def test_warmup_runs_every_method_untimed(lm):
    log = []
    run = run_rows(lm, ROWS[:1], [Spy("ar", log), Spy("racer", log)], BenchSettings(**FAST), encode=encode,
                   progress=False)
    assert [n for n, _, _ in log] == ["ar", "racer", "ar", "racer"]
    assert [len(o.token_ids) for _, _, o in log[:2]] == [4, 4]   # warm-up tokens
    assert len(run.results) == 2 and run.runs_done == run.runs_planned == 2


def test_multi_turn_appends_each_methods_own_answer(lm):
    log = []
    run = run_rows(lm, [ROWS[1]], [Spy("ar", log), Spy("racer", log)], BenchSettings(**{**FAST, "warmup": 0}),
                   encode=encode, progress=False)
    by = {(r["method"], r["turn"]): r for r in run.results}
    assert set(by) == {("ar", 1), ("ar", 2), ("racer", 1), ("racer", 2)}
    for name in ("ar", "racer"):
        (_, p1, o1), (_, p2, o2) = [x for x in log if x[0] == name]
        answer = o1.token_ids
        expected = encode([{"role": "user", "content": ROWS[1].turns[0]},
                           {"role": "assistant", "content": by[(name, 1)]["text"]},
                           {"role": "user", "content": ROWS[1].turns[1]}])
        assert p2 == expected
        assert p2[len(p1):len(p1) + len(answer)] == answer   # its own answer, then the next user turn
        assert o2.info["new_from"] == len(p1) + len(answer)  # the session's drafter saw turn 1 already
        assert by[(name, 2)]["prompt_len"] == len(p2)
    assert run.record.same_prompt[("q2", 2, "racer")] is True


def test_turns_first_limit_categories(tmp_path):
    p = tmp_path / "rows.jsonl"
    lines = [json.dumps({"question_id": i, "category": "ab"[i % 2], "turns": [f"q{i}", f"follow {i}"]})
             for i in range(6)]
    lines.insert(2, "{not json")
    lines.insert(4, json.dumps({"question_id": 99, "category": "a", "turns": []}))
    lines.append(json.dumps({"question_id": 0, "category": "a", "turns": ["dup"]}))
    lines.append(json.dumps({"category": "a", "turns": ["no id"]}))
    p.write_text("\n".join(lines) + "\n\n")
    rows, skipped = load_rows(p)
    assert [r.question_id for r in rows] == ["0", "1", "2", "3", "4", "5"]
    reasons = {(s.line, s.question_id): s.reason for s in skipped}
    assert len(skipped) == 4
    assert any("invalid JSON" in r for r in reasons.values())
    assert reasons[(5, "99")].startswith("turns must be")
    assert any(r == "duplicate question_id" for r in reasons.values())
    assert any(r == "no question_id" for r in reasons.values())
    assert [r.question_id for r in load_rows(p, limit=2)[0]] == ["0", "1"]
    assert [r.question_id for r in load_rows(p, categories=["b"], limit=2)[0]] == ["1", "3"]
    assert [r.question_id for r in load_rows(p, per_category=1)[0]] == ["0", "1"]
    assert all(len(r.turns) == 1 for r in load_rows(p, turns="first")[0])
    with pytest.raises(ValueError, match="unknown categories"):
        load_rows(p, categories=["zzz"])


def test_shipped_prompts_are_the_default():
    rows, skipped = load_rows()
    assert DEFAULT_DATA.name == "bench_prompts.jsonl" and len(rows) == 40 and not skipped
    assert len({r.category for r in rows}) == 8
    assert parse_args(["--out", "x"]).data == str(DEFAULT_DATA)


def test_cli_arguments():
    a = parse_args(["--out", "d", "--methods", "ar,hf-pld", "--capacity", "auto", "--limit", "3", "--turns", "first"])
    assert a.methods == "ar,hf-pld" and a.limit == 3 and a.turns == "first"
    assert parse_capacity("auto") == "auto" and parse_capacity("24") == 24 and parse_capacity(None) is None
    with pytest.raises(ValueError):
        parse_capacity("big")
    with pytest.raises(ValueError, match="unknown method"):
        get_method("nope")


def test_too_long_prompts_are_skipped_and_reported(tmp_path):
    small = tiny_lm(vocab=V, max_context=48)
    long_row = Row("long", "copy", ["w " * 60])
    grows = Row("grows", "chat", ["a b c d", "e f g h " * 4])   # turn 2 = turn 1 + 16 answer tokens + 17
    out = run_benchmark(small, [long_row, ROWS[2], grows], ["ar", "racer"], BenchSettings(**FAST), out_dir=tmp_path,
                        encode=encode, images=False, cost_curve=False, progress=False)
    sk = {(s["question_id"], s.get("turn")): s for s in out.summary["skipped"]}
    assert ("long", 1) in sk and "prompt of 62 tokens" in sk[("long", 1)]["reason"]
    assert ("grows", 2) in sk and sk[("grows", 2)]["prompt_lens"].keys() == {"ar", "racer"}
    assert {(r["question_id"], r["turn"]) for r in out.results} == {("q3", 1), ("grows", 1)}
    assert out.run.runs_done == out.run.runs_planned
    assert "## Skipped" in (tmp_path / "report.md").read_text()


# -- identical-output accounting ----------------------------------------------------------------

class WrongDrafter(Drafter):
    """A broken drafter: proposes a token the model would not pick, and (with a trusting
    acceptance rule) gets it committed."""
    name = "broken"

    def propose(self, context, root, capacity):
        t = DraftTree.root_only(root)
        t.add(0, (root + 1) % V, "logits")
        return t


def trusting_accept(tree, logits):
    """Accept the first child of the root without checking it (the bug)."""
    path = [0] + ([1] if len(tree) > 1 else [])
    return path, int(logits[path[-1]].argmax())


def test_broken_drafter_is_caught(lm, tmp_path):
    broken = LoopMethod("broken", factory=lambda lm: WrongDrafter(), accept=trusting_accept)
    out = run_benchmark(lm, ROWS, ["ar", "racer", broken], BenchSettings(**FAST), out_dir=tmp_path, encode=encode,
                        images=False, cost_curve=False, progress=False)
    s = out.summary
    assert s["identical_check"]["ok"] is False
    bad = s["methods"]["broken"]["identical"]
    assert bad["compared"] == 4 and bad["identical"] == 0
    first = [d for d in bad["differences"] if d["turn"] == 1]
    assert first and all(d["verdict"] == "mismatch" for d in first)
    for d in first:
        assert d["position"] == 1 and d["gap"] > 1.0 and d["method_token_rank"] >= 1 and d["margin_top2"] > 0
    # Turn 2 of the two-turn row starts from a different answer: reported, but as inherited.
    assert [d["verdict"] for d in bad["differences"] if d["turn"] == 2] == ["inherited"]
    assert s["methods"]["broken"]["overall"]["identical_to_ar"] == 0
    assert s["methods"]["racer"]["identical"]["identical"] == 4
    assert "MISMATCHES FOUND" in (tmp_path / "report.md").read_text()


def test_margin_and_tie_verdict(lm):
    prompt = encode([{"role": "user", "content": "alpha beta gamma"}])
    run = run_rows(lm, [Row("m", "x", ["alpha beta gamma"])], ["ar"], BenchSettings(**{**FAST, "warmup": 0}),
                   encode=encode, progress=False)
    ar = run.results[0]
    with torch.inference_mode():
        logits = lm.model(input_ids=torch.tensor([prompt + ar["token_ids"][:3]])).logits[0, -1]
    second = int(logits.topk(2).indices[1])
    fake = dict(ar, method="other", token_ids=ar["token_ids"][:3] + [second])
    res = compare_outputs(lm, [ar, fake], run.record, tolerance=1e9)["other"]
    d = res["differences"][0]
    assert d["position"] == 3 and d["method_token_rank"] == 1 and d["verdict"] == "tie"
    top = logits.topk(2).values
    assert d["margin_top2"] == pytest.approx(float(top[0] - top[1]), abs=1e-4) == pytest.approx(d["gap"], abs=1e-4)
    strict = compare_outputs(lm, [ar, fake], run.record, tolerance=0.0)["other"]["differences"][0]
    assert strict["verdict"] == "mismatch"


def test_the_margin_is_read_on_plain_decodings_own_logits(lm):
    # The tie check reads ar's logits as ar computed them (prefill, then one token per forward):
    # each of ar's tokens is the argmax of what next_logits returns before it.
    prompt = encode([{"role": "user", "content": "alpha beta gamma delta"}])
    run = run_rows(lm, [Row("m", "x", ["alpha beta gamma delta"])], ["ar"], BenchSettings(**{**FAST, "warmup": 0}),
                   encode=encode, progress=False)
    tokens = run.results[0]["token_ids"]
    assert len(tokens) > 3
    for i, tok in enumerate(tokens):
        assert int(next_logits(lm, prompt, tokens[:i]).argmax()) == tok


def test_helpers():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2
    assert clip_output([5, 6, 7, 8], {7}, 10) == [5, 6, 7]
    assert clip_output([5, 6, 7, 8], set(), 2) == [5, 6]
    assert clip_lengths([1, 3, 2], 3) == [1, 2]


# -- sampling, interruption, capacity ---------------------------------------------------------------

def test_sampling_runs_without_identity_check(lm):
    st = BenchSettings(**{**FAST, "temperature": 0.9, "top_p": 0.95, "top_k": 20, "seed": 3})
    out = run_benchmark(lm, ROWS[:1], ["ar", "racer", "hf", "hf-pld"], st, encode=encode, cost_curve=False,
                        progress=False)
    assert out.summary["identical_check"] is None and out.summary["settings"]["greedy"] is False
    assert all(r["new_tokens"] == 16 for r in out.results)
    kw = HFMethod("hf").conversation(lm).generate_kwargs(st.config())
    assert kw["do_sample"] and kw["top_k"] == 20 and kw["top_p"] == 0.95 and kw["temperature"] == 0.9
    assert HFMethod("hf-pld", 10).conversation(lm).generate_kwargs(st.config())["prompt_lookup_num_tokens"] == 10


def test_ctrl_c_keeps_what_finished(lm, tmp_path):
    calls = {"n": 0}

    class Interrupting(LoopMethod):
        def conversation(self, lm_):
            inner = super().conversation(lm_)

            class S(Conversation):
                def run(self, ids, cfg):
                    calls["n"] += 1
                    if calls["n"] == 4:       # warm-up is call 1; then q1, q2 t1, q2 t2 finish
                        raise KeyboardInterrupt
                    return inner.run(ids, cfg)
            return S()

    out = run_benchmark(lm, ROWS, ["ar", Interrupting("pld")], BenchSettings(**FAST), out_dir=tmp_path,
                        encode=encode, images=False, progress=False)
    assert out.summary["interrupted"] is True
    done = [(r["question_id"], r["turn"], r["method"]) for r in out.results]
    assert done == [("q1", 1, "ar"), ("q1", 1, "pld"), ("q2", 1, "ar"), ("q2", 1, "pld"), ("q2", 2, "ar")]
    assert len((tmp_path / "results.jsonl").read_text().splitlines()) == 5
    assert json.loads((tmp_path / "summary.json").read_text())["interrupted"] is True
    assert "Interrupted" in (tmp_path / "report.md").read_text()


def test_failed_run_is_reported_and_the_rest_go_on(lm):
    q1 = encode([{"role": "user", "content": ROWS[0].turns[0]}])

    class Failing(LoopMethod):
        def conversation(self, lm_):
            class S(Conversation):
                def run(self, ids, cfg):
                    if ids == q1:
                        raise RuntimeError("boom")
                    return LoopMethod("ar").conversation(lm_).run(ids, cfg)
            return S()

    run = run_rows(lm, ROWS, ["ar", Failing("bad")], BenchSettings(**{**FAST, "warmup": 0}), encode=encode,
                   progress=False)
    assert {e["question_id"] for e in run.errors} == {"q1"} and run.errors[0]["error"] == "RuntimeError: boom"
    assert [(r["question_id"], r["turn"]) for r in run.results if r["method"] == "bad"] == [("q2", 1), ("q2", 2),
                                                                                            ("q3", 1)]
    assert run.runs_done == run.runs_planned


def test_capacity_auto_is_passed_through(lm, tmp_path, monkeypatch):
    monkeypatch.setenv("RACER_CACHE", str(tmp_path))
    st = BenchSettings(**{**FAST, "capacity": "auto"})
    run = run_rows(lm, ROWS[:1], ["ar", "racer"], st, encode=encode, progress=False)
    assert st.config().capacity == "auto" and st.resolved_capacity() == "auto"
    assert all(r["step_ms"].get("sizing") for r in run.results)


def test_cli_end_to_end(lm, tmp_path, monkeypatch):
    """The real command line, with the tiny model and its prompt builder swapped in."""
    import racer.models
    from racer.bench.__main__ import main
    monkeypatch.setattr(racer.models, "load_model", lambda *a, **k: lm)
    monkeypatch.setattr("racer.bench.runner.build_input_ids", lambda tok, msgs: encode(msgs))
    data = tmp_path / "rows.jsonl"
    data.write_text("\n".join(json.dumps(r.to_dict()) for r in ROWS) + "\n{broken\n")
    out = tmp_path / "out"
    argv = ["--data", str(data), "--limit", "2", "--methods", "ar,racer,hf", "--max-new-tokens", "8", "--capacity", "8",
            "--out", str(out), "--no-cost-curve", "--no-progress"]
    assert main(argv) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["command"] == "python -m racer.bench " + " ".join(argv)
    assert s["data"]["limit"] == 2 and s["settings"]["capacity"] == 8
    assert [x["reason"][:12] for x in s["skipped"]] == ["invalid JSON"]
    assert len((out / "results.jsonl").read_text().splitlines()) == 3 * 3   # q1, q2 (2 turns)
    assert s["bandwidth"]["weight_bytes"] > 0 and s["bandwidth"]["stream_gbs"] > 0
    s_bytes = s["bandwidth"]["weight_bytes"]
    assert "## How close to the machine's limit" in (out / "report.md").read_text()
    # A run made without the figures gets them on --report-only --add-bandwidth.
    del s["bandwidth"]
    (out / "summary.json").write_text(json.dumps(s))
    assert main(["--out", str(out), "--report-only"]) == 0
    assert "machine's limit" not in (out / "report.md").read_text()
    assert main(["--out", str(out), "--report-only", "--add-bandwidth"]) == 0
    assert json.loads((out / "summary.json").read_text())["bandwidth"]["weight_bytes"] == s_bytes
    assert "## How close to the machine's limit" in (out / "report.md").read_text()
    assert main(argv + ["--methods", "ar,nope"]) == 2   # the last --methods wins: an unknown name


def test_bench_figures_cover_every_plot_of_the_report(full_run, tmp_path):
    from racer.bench.report import PLOTS
    from visuals.bench_figures import main
    figs = bench_figures(full_run[0].summary)
    assert set(figs) == set(PLOTS)
    # The command adds them to a run folder's report.
    (tmp_path / "summary.json").write_text(json.dumps(full_run[0].summary))
    assert main([str(tmp_path), "--no-images"]) == 0
    report = (tmp_path / "report.md").read_text()
    assert all((tmp_path / "plots" / f"{n}.html").is_file() and f"plots/{n}.html" in report for n in PLOTS)


def test_stock_kernel_baselines_run_stock_and_restore(lm):
    # hf-pld-stock runs generate() on PyTorch's own linear layers (transformers as installed)
    # and leaves the model on the kernel every other method uses.
    from racer.bench.methods import HFMethod
    from racer.cpu.linear import kernel_of, use_kernel

    before = kernel_of(lm.model)
    seen = []
    orig = lm.model.generate

    def spy(*a, **k):
        seen.append(kernel_of(lm.model))
        return orig(*a, **k)

    lm.model.generate = spy
    try:
        out = run_benchmark(lm, ROWS[:1], ["ar", "hf-pld-stock", "hf-stock"], BenchSettings(**FAST), encode=encode,
                            cost_curve=False, progress=False)
    finally:
        del lm.model.generate
    assert seen and set(seen) == {"stock"} and kernel_of(lm.model) == before
    assert out.summary["identical_check"] is not None
    assert HFMethod("x", stock_kernel=True).stock_kernel
    use_kernel(lm.model, before)


def test_per_method_capacity_sweeps_in_one_run(lm, tmp_path, monkeypatch):
    monkeypatch.setenv("RACER_CACHE", str(tmp_path))
    m = get_method("racer@4")
    assert isinstance(m, LoopMethod) and m.capacity == 4 and m.name == "racer@4"
    assert get_method("tr@auto").capacity == "auto"
    for bad in ("hf-pld@8", "racer@0", "racer@x", "nope@8"):
        with pytest.raises(ValueError):
            get_method(bad)
    # The run's capacity is 16; each method keeps its own, and all stay identical to ar.
    run = run_rows(lm, ROWS[:2], ["ar", "racer@2", "racer@5", "racer@auto"], BenchSettings(**FAST), encode=encode,
                   progress=False)
    by = {}
    for r in run.results:
        by.setdefault(r["method"], []).append(r)
    assert max(max(r["tree_sizes"]) for r in by["racer@2"]) == 2
    assert max(max(r["tree_sizes"]) for r in by["racer@5"]) <= 5
    assert max(max(r["tree_sizes"]) for r in by["racer@5"]) > 2
    assert all(r["step_ms"].get("sizing") for r in by["racer@auto"])
    assert not any(r["step_ms"].get("sizing") for r in by["racer@5"])
    ref = {(r["question_id"], r["turn"]): r["token_ids"] for r in by["ar"]}
    for name in ("racer@2", "racer@5", "racer@auto"):
        assert all(r["token_ids"] == ref[(r["question_id"], r["turn"])] for r in by[name])


def test_round_robin_alternates_categories():
    rows = [Row(str(i), c, ["x"]) for i, c in enumerate("aaabbc")]
    from racer.bench.data import select_rows
    assert [r.question_id for r in select_rows(rows, round_robin=True)] == ["0", "3", "5", "1", "4", "2"]
    assert [r.question_id for r in select_rows(rows, per_category=2, round_robin=True, limit=4)] == ["0", "3", "5", "1"]
    assert [r.question_id for r in select_rows(rows)] == ["0", "1", "2", "3", "4", "5"]
    assert parse_args(["--out", "x", "--round-robin"]).round_robin


def test_sizer_variants_run_side_by_side(lm, tmp_path, monkeypatch):
    # racer@auto-cal / racer@auto-nocal: an A/B of the sizer's calibration in one interleaved run.
    monkeypatch.setenv("RACER_CACHE", str(tmp_path))
    # A curve no real tiny forward comes near 1.5x of: no forward counts as disturbed, so what
    # the calibrating sizer learns does not depend on how busy the test machine is.
    import racer.bench.methods as bench_methods
    sizes = [1, 2, 4, 8, 16, 32, 64]
    generous = CostCurve(sizes, [64, 512], [[100.0] * len(sizes)] * 2, {"test": "generous"})
    monkeypatch.setattr(bench_methods, "get_cost_curve", lambda lm: generous)
    cal, nocal = get_method("racer@auto-cal"), get_method("racer@auto-nocal")
    assert cal.capacity == nocal.capacity == "auto"
    assert cal.sizer_options == {"calibrate": True} and nocal.sizer_options == {"calibrate": False}
    with pytest.raises(ValueError, match="auto-cal"):
        get_method("racer@auto-maybe")
    convs = {m.name: m.conversation(lm) for m in (cal, nocal)}
    for conv in convs.values():
        conv.run(encode([{"role": "user", "content": ROWS[0].turns[0]}]),
                 DecodeConfig(max_new_tokens=12, capacity="auto"))
    assert convs["racer@auto-cal"].sizer.calibrate is True
    assert sum(convs["racer@auto-cal"].sizer.calibration.count.values()) > 0
    assert convs["racer@auto-nocal"].sizer.calibrate is False
    assert convs["racer@auto-nocal"].sizer.calibration.count == {}


def test_a_rows_system_prompt_opens_every_turns_chat(lm):
    rows, skipped = read_rows([json.dumps({"question_id": "s", "category": "chat", "system": "be brief",
                                           "turns": ["a b c d", "again"]}),
                               json.dumps({"question_id": "bad", "category": "chat", "system": 3, "turns": ["x"]})])
    assert [r.system for r in rows] == ["be brief"] and skipped[0].reason == "system must be a string"
    sent: list[list[dict]] = []

    def recording(messages):
        sent.append(messages)
        return encode(messages)

    run_rows(lm, rows, ["ar"], BenchSettings(**{**FAST, "warmup": 0}), encode=recording)
    firsts = [m[0] for m in sent]
    assert firsts and all(m == {"role": "system", "content": "be brief"} for m in firsts)
    assert any(len(m) == 4 and m[2]["role"] == "assistant" for m in sent)   # turn 2: system, user, answer, user
