"""Spec-Bench answer files (`python -m racer.bench ... --export spec-bench DIR`) and Spec-Bench's
speed-up in the summary and report, on the tiny model."""
import importlib.util
import json
import os
import statistics
from pathlib import Path

import pytest
import torch

from racer.bench import BenchSettings, run_benchmark
from racer.bench.specbench import export, model_id, specbench_speedup
from racer.tiny import tiny_lm
from tests.test_bench import FAST, ROWS, encode

V = 96
METHODS = ["ar", "racer", "hf"]
LINE_KEYS = {"question_id", "category", "answer_id", "model_id", "choices", "tstamp"}
CHOICE_KEYS = {"index", "turns", "decoding_steps", "new_tokens", "wall_time", "accept_lengths"}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    res = run_benchmark(tiny_lm(vocab=V), ROWS, METHODS, BenchSettings(**FAST), out_dir=out, encode=encode,
                        images=False, progress=False, cost_curve=False)
    return res, out


def read(path):
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines()]


def test_answer_files_are_in_spec_bench_format(run, tmp_path):
    res, _ = run
    done = export(res.results, tmp_path, model="tiny-llama", dtype="float32", temperature=0.0, methods=METHODS)
    assert set(done["files"]) == set(METHODS) and done["questions"] == len(ROWS) and done["left_out"] == []
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"tiny-llama-{m}-float32-temp-0.0.jsonl"
                                                                for m in METHODS)
    for m in METHODS:
        lines = read(done["files"][m])
        assert [x["question_id"] for x in lines] == [r.question_id for r in ROWS]  # same questions, same order
        for line, row in zip(lines, ROWS):
            assert set(line) == LINE_KEYS and line["category"] == row.category
            assert line["model_id"] == Path(done["files"][m]).stem == model_id("tiny-llama", m, "float32", 0.0)
            assert len(line["choices"]) == 1
            c = line["choices"][0]
            assert set(c) == CHOICE_KEYS and c["index"] == 0
            mine = sorted((r for r in res.results if r["method"] == m and r["question_id"] == row.question_id),
                          key=lambda r: r["turn"])
            n = len(row.turns)
            assert len(c["turns"]) == len(c["new_tokens"]) == len(c["wall_time"]) == len(c["decoding_steps"]) == n
            assert c["turns"] == [r["text"] for r in mine] and all(isinstance(t, str) for t in c["turns"])
            assert c["new_tokens"] == [r["new_tokens"] for r in mine]
            assert c["wall_time"] == [r["wall_s"] for r in mine] and min(c["wall_time"]) > 0
            # Per step, every turn in order: they add up to the answer's tokens.
            assert c["accept_lengths"] == [k for r in mine for k in r["accept_lengths"]]
            assert sum(c["accept_lengths"]) == sum(c["new_tokens"])
            assert c["decoding_steps"] == [len(r["accept_lengths"]) for r in mine]
    # equal.py compares str(choices[0].turns) line by line: greedy racer equals ar.
    turns = {m: [str(x["choices"][0]["turns"]) for x in read(done["files"][m])] for m in METHODS}
    assert turns["racer"] == turns["ar"]


def test_summary_and_files_give_the_same_spec_bench_speedup(run, tmp_path):
    res, out = run
    files = export(res.results, tmp_path, model="tiny", dtype="float32", temperature=0.0)["files"]

    def mean_speed(path):  # what speed.py averages: per question, all its turns together
        return statistics.fmean(sum(c["new_tokens"]) / sum(c["wall_time"])
                                for c in (x["choices"][0] for x in read(path)))

    s = json.loads((out / "summary.json").read_text())
    for m in METHODS:
        o = s["methods"][m]["overall"]
        assert o["specbench_speedup_vs_ar"] == pytest.approx(mean_speed(files[m]) / mean_speed(files["ar"]), rel=1e-3)
        assert o["specbench_speedup_vs_hf"] == pytest.approx(mean_speed(files[m]) / mean_speed(files["hf"]), rel=1e-3)
        assert "speedup_vs_ar" in o  # the ratio of totals stays, beside it
    md = (out / "report.md").read_text()
    assert "Spec-Bench speedup vs ar" in md and "## Per category: MAT / Spec-Bench speedup vs ar" in md


def test_spec_bench_speedup_weighs_questions_not_tokens():
    def row(q, tokens, wall, turn=1):
        return {"question_id": q, "turn": turn, "new_tokens": tokens, "wall_s": wall}
    method = [row("long", 100, 1.0), row("short", 10, 1.0)]
    base = [row("long", 100, 2.0), row("short", 10, 1.0)]
    per_question = statistics.fmean([100 / 1.0, 10 / 1.0]) / statistics.fmean([100 / 2.0, 10 / 1.0])
    totals = (110 / 2.0) / (110 / 3.0)
    assert specbench_speedup(method, base) == pytest.approx(per_question, rel=1e-4)
    assert per_question != pytest.approx(totals)
    # Turns of one question count together; a question the baseline lacks does not count.
    two_turns = [row("q", 10, 1.0, 1), row("q", 30, 1.0, 2), row("extra", 99, 0.1)]
    assert specbench_speedup(two_turns, [row("q", 10, 2.0, 1), row("q", 30, 2.0, 2)]) == pytest.approx(
        (40 / 2.0) / (40 / 4.0))
    assert specbench_speedup(method, []) is None


def test_questions_not_finished_by_every_method_are_left_out(run, tmp_path):
    res, _ = run
    partial = [r for r in res.results if not (r["method"] == "racer" and r["question_id"] == "q2" and r["turn"] == 2)]
    done = export(partial, tmp_path, model="tiny", dtype="float32", temperature=0.0)
    assert done["left_out"] == ["q2"] and done["questions"] == 2
    for path in done["files"].values():
        assert [x["question_id"] for x in read(path)] == ["q1", "q3"]


def test_cli_export(run, tmp_path, capsys):
    from racer.bench.__main__ import main
    _, out = run
    dest = tmp_path / "spec"
    assert main(["--out", str(out), "--report-only", "--export", "spec-bench", str(dest)]) == 0
    assert len(list(dest.glob("*.jsonl"))) == len(METHODS)
    assert main(["--out", str(out), "--report-only", "--export", "mt-bench", str(dest)]) == 2
    assert "--export: unknown format 'mt-bench'" in capsys.readouterr().err


SPEC_BENCH = os.environ.get("SPEC_BENCH_DIR")


@pytest.mark.skipif(not SPEC_BENCH, reason="set SPEC_BENCH_DIR to a Spec-Bench checkout (and "
                                           "SPEC_BENCH_TOKENIZER to a tokenizer folder) to run its own scripts")
def test_spec_bench_scripts_read_the_files(run, tmp_path, capsys):
    """Spec-Bench's own evaluation/speed.py and equal.py, unchanged, on exported files."""
    def load(name):
        spec = importlib.util.spec_from_file_location(name, Path(SPEC_BENCH) / "evaluation" / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    res, _ = run
    files = export(res.results, tmp_path, model="tiny", dtype="float32", temperature=0.0)["files"]
    speed, equal = load("speed"), load("equal")
    tps, _, _, accept = speed.speed(files["racer"], files["ar"], os.environ["SPEC_BENCH_TOKENIZER"], task="overall")
    lines = read(files["racer"])
    assert tps == pytest.approx(statistics.fmean(sum(x["choices"][0]["new_tokens"]) / sum(x["choices"][0]["wall_time"])
                                                 for x in lines))
    assert sum(accept) == sum(sum(x["choices"][0]["new_tokens"]) for x in lines)
    equal.run_compare(str(tmp_path) + "/", Path(files["ar"]).name, Path(files["racer"]).name)
    assert "Result totally Equal!" in capsys.readouterr().out
