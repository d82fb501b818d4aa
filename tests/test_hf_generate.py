"""racer.generate inside transformers' generate(): exactness against stock generate(), logits
processors, stopping criteria, streamers, sampling, refused options, sessions, the Hub folder."""
import random
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import (DynamicCache, Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM, StoppingCriteria, StoppingCriteriaList, T5Config,
                          T5ForConditionalGeneration, TextIteratorStreamer, TextStreamer)
from transformers.generation import GenerateDecoderOnlyOutput
from transformers.generation.streamers import BaseStreamer

import racer
import racer.hf_generate as hfg
from racer import GenerateSession, build_input_ids
from racer.tiny import tiny_lm
from racer.verify import Sampling
from tests.test_loop_tiny import SV, chi2, chi2_critical, joint_probs

ROOT = Path(__file__).resolve().parent.parent
V = 96


def plain(kind: str, vocab: int = V):
    """A transformers model as a user builds it (no racer kernels installed)."""
    torch.manual_seed(0)
    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512)
    if kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common, attn_implementation="sdpa"))
    elif kind == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common, attn_implementation="sdpa"))
    else:  # sliding-window layers (the window folded into racer's tree masks)
        model = Gemma3ForCausalLM(Gemma3TextConfig(**common, head_dim=16, sliding_window=96,
                                                   attn_implementation="eager"))
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)  # sharp output, repetitive text: drafts get accepted
    return model.eval()


@pytest.fixture(scope="module")
def model():
    """racer's tiny Llama, with racer's CPU kernels installed as load_model installs them."""
    return tiny_lm(vocab=V).model


def prompt(seed: int, n: int = 24) -> torch.Tensor:
    rng = random.Random(seed)
    chunk = [rng.randrange(3, V) for _ in range(6)]  # 0-2 are special in the configs (pad, bos, eos)
    out: list[int] = []
    while len(out) < n:
        out += chunk if rng.random() < 0.5 else [rng.randrange(3, V)]
    return torch.tensor([out[:n]])


def stock(model, ids, **kw):
    return model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, **kw)


def ours(model, ids, **kw):
    return model.generate(ids, attention_mask=torch.ones_like(ids), custom_generate=racer.generate, **kw)


# -- greedy: token for token the output of stock generate() ---------------------------------------

@pytest.mark.parametrize("kind", ["racer-tiny", "llama", "qwen2", "gemma3"])
def test_greedy_equals_stock_generate(model, kind):
    m = model if kind == "racer-tiny" else plain(kind)
    accepted = 0
    for seed in range(3):
        ids = prompt(seed)
        for n in (1, 2, 7, 50):
            ref = stock(m, ids, max_new_tokens=n)
            for drafter in ("racer", "tr", "pld"):
                out = ours(m, ids, max_new_tokens=n, drafter=drafter, capacity=16, return_dict_in_generate=True)
                assert torch.equal(out.sequences, ref), (kind, seed, n, drafter)
                assert sum(out.accept_lengths) == ref.shape[1] - ids.shape[1]
                accepted += max(out.accept_lengths) > 1
    assert accepted > 0  # drafts were really accepted, so the equality had teeth


def test_default_capacity_auto_equals_stock(model):
    ids = prompt(4)
    assert torch.equal(ours(model, ids, max_new_tokens=40), stock(model, ids, max_new_tokens=40))


def test_eos_stop_equals_stock(model):
    ids = prompt(5)
    free = stock(model, ids, max_new_tokens=40, eos_token_id=None)[0, ids.shape[1]:].tolist()
    for eos in (free[12], [free[20], free[5]]):
        ref = stock(model, ids, max_new_tokens=40, eos_token_id=eos)
        out = ours(model, ids, max_new_tokens=40, eos_token_id=eos, capacity=16)
        assert torch.equal(out, ref)
        first = min(free.index(e) for e in ([eos] if isinstance(eos, int) else eos))
        assert out.shape[1] == ids.shape[1] + first + 1  # stopped at the end-of-sequence token, kept it


#: Each builds its generate() options from the unconstrained greedy output `free`; the length
#: processors get an end-of-sequence token from it to work against (or towards).
PROCESSORS = {
    "min_new_tokens": lambda free: {"min_new_tokens": 9, "eos_token_id": free[3]},
    "exponential_decay_length_penalty": lambda free: {"exponential_decay_length_penalty": (2, 3.0),
                                                      "eos_token_id": free[20]},
    "repetition_penalty": lambda free: {"repetition_penalty": 1.5},
    "no_repeat_ngram_size": lambda free: {"no_repeat_ngram_size": 2},
    "suppress_tokens": lambda free: {"suppress_tokens": [free[1], free[2]]},
    "bad_words_ids": lambda free: {"bad_words_ids": [[free[1]], [free[4], free[5]]]},
}


@pytest.mark.parametrize("name", list(PROCESSORS))
def test_logits_processors_equal_stock(model, name):
    ids = prompt(6)
    free = stock(model, ids, max_new_tokens=30, eos_token_id=None)[0, ids.shape[1]:].tolist()
    options = {"eos_token_id": None, **PROCESSORS[name](free)}
    ref = stock(model, ids, max_new_tokens=30, **options)
    out = ours(model, ids, max_new_tokens=30, capacity=16, **options)
    assert torch.equal(out, ref), options
    without = {k: v for k, v in options.items() if k == "eos_token_id"}
    assert not torch.equal(ref, stock(model, ids, max_new_tokens=30, **without))  # the processor had teeth


class StopAt(StoppingCriteria):
    def __init__(self, token: int) -> None:
        self.token = token

    def __call__(self, input_ids, scores, **kwargs):
        return input_ids[:, -1] == self.token


def test_stopping_criteria_cut_inside_a_step(model):
    ids = prompt(1)
    free = ours(model, ids, max_new_tokens=60, eos_token_id=None, capacity=16, return_dict_in_generate=True)
    new = free.sequences[0, ids.shape[1]:].tolist()
    # A token committed in the middle of a multi-token step, so the cut is inside a step.
    cum, target = 0, None
    for n in free.accept_lengths:
        if n >= 3:
            target = new[cum + 1]
            break
        cum += n
    assert target is not None
    crit = StoppingCriteriaList([StopAt(target)])
    ref = stock(model, ids, max_new_tokens=60, eos_token_id=None, stopping_criteria=crit)
    out = ours(model, ids, max_new_tokens=60, eos_token_id=None, stopping_criteria=crit, capacity=16)
    assert torch.equal(out, ref)
    assert out[0, -1].item() == target and out.shape[1] == ids.shape[1] + new.index(target) + 1


def test_return_dict(model):
    ids = prompt(2)
    out = ours(model, ids, max_new_tokens=30, capacity=16, return_dict_in_generate=True)
    assert isinstance(out, GenerateDecoderOnlyOutput)
    assert torch.equal(out.sequences, stock(model, ids, max_new_tokens=30))
    assert out.scores is None and sum(out.accept_lengths) == 30 and len(out.accept_lengths) < 30


# -- streamers ---------------------------------------------------------------------------------

class Recorder(BaseStreamer):
    def __init__(self) -> None:
        self.puts: list[list[int]] = []
        self.ended = 0

    def put(self, value):
        self.puts.append(value.reshape(-1).tolist())

    def end(self):
        self.ended += 1


def test_streamer_gets_each_step_in_order(model):
    ids = prompt(3)
    rec = Recorder()
    out = ours(model, ids, max_new_tokens=50, capacity=16, streamer=rec, return_dict_in_generate=True)
    assert rec.puts[0] == ids[0].tolist()  # generate() itself sends the prompt first, as always
    steps = rec.puts[1:]
    assert [len(s) for s in steps] == out.accept_lengths
    assert sum(steps, []) == out.sequences[0, ids.shape[1]:].tolist()
    assert max(len(s) for s in steps) > 1 and rec.ended == 1


def test_text_streamers_equal_returned_text(model, capsys):
    tok = tiny_lm(vocab=V).tokenizer
    ids = prompt(3)
    out = ours(model, ids, max_new_tokens=40, capacity=16, streamer=TextStreamer(tok, skip_prompt=True))
    text = tok.decode(out[0, ids.shape[1]:].tolist())
    assert capsys.readouterr().out.rstrip("\n") == text
    it = TextIteratorStreamer(tok, skip_prompt=True, timeout=60)
    th = threading.Thread(target=lambda: ours(model, ids, max_new_tokens=40, capacity=16, streamer=it))
    th.start()
    streamed = "".join(it)
    th.join()
    assert streamed == text


# -- sampling ------------------------------------------------------------------------------------

def test_seeded_sampling_is_reproducible(model):
    ids = prompt(7)
    kw = dict(max_new_tokens=30, do_sample=True, temperature=0.9, top_p=0.95, capacity=16)
    runs = []
    for seed in (1, 1, 2, 3):
        torch.manual_seed(seed)
        runs.append(ours(model, ids, **kw)[0].tolist())
    assert runs[0] == runs[1]
    assert len({tuple(r) for r in runs}) >= 3  # different seeds draw different texts


def test_sampling_is_lossless_through_generate():
    lm = tiny_lm(vocab=SV, seed=3)
    m = lm.model
    with torch.no_grad():
        m.lm_head.weight.mul_(0.15)  # soften: many outcomes with real mass
    m.generation_config.eos_token_id = None  # every token of the small vocabulary is text here
    s = Sampling(temperature=0.7, top_p=0.9)
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    probs = joint_probs(lm, ids[0].tolist(), s)
    counts = np.zeros((SV, SV))
    multi = 0
    for i in range(2000):
        torch.manual_seed(1000 + i)
        out = m.generate(ids, custom_generate=racer.generate, max_new_tokens=3, do_sample=True, temperature=0.7,
                         top_p=0.9, top_k=0, capacity=64, drafter="racer", return_dict_in_generate=True)
        new = out.sequences[0, 5:].tolist()
        counts[new[1], new[2]] += 1
        multi += max(out.accept_lengths) > 1
    stat, df = chi2(counts, probs)
    assert stat < chi2_critical(df), (stat, df)
    assert multi > 400  # tokens 2 and 3 often came from accepted drafts: the law was tested through the tree


# -- refused options -----------------------------------------------------------------------------

@pytest.mark.parametrize("options, name", [
    ({"num_beams": 2}, "num_beams"),
    ({"num_return_sequences": 2, "do_sample": True}, "num_return_sequences"),
    ({"prompt_lookup_num_tokens": 3}, "prompt_lookup_num_tokens"),
    ({"assistant_early_exit": 1}, "assistant_early_exit"),
    ({"use_mtp": True}, "use_mtp"),
    ({"penalty_alpha": 0.6, "top_k": 4}, "penalty_alpha"),
    ({"dola_layers": "low"}, "dola_layers"),
    ({"guidance_scale": 1.5}, "guidance_scale"),
    ({"force_words_ids": [[9]], "num_beams": 2}, "force_words_ids"),
    ({"return_dict_in_generate": True, "output_scores": True}, "output_scores"),
    ({"return_dict_in_generate": True, "output_logits": True}, "output_logits"),
    ({"return_dict_in_generate": True, "output_attentions": True}, "output_attentions"),
    ({"return_dict_in_generate": True, "output_hidden_states": True}, "output_hidden_states"),
    ({"synced_gpus": True}, "synced_gpus"),
    ({"drafter": "nope"}, "drafter"),
    ({"capacity": 0}, "capacity"),
    ({"max_new_tokens": 600}, "max_new_tokens"),
    ({"stop_strings": ["t5"]}, "stop string"),
])
def test_refused_option_is_named(model, options, name):
    with pytest.raises(ValueError, match=name):
        ours(model, prompt(0), **{"max_new_tokens": 8, **options})


def test_refused_inputs_are_named(model):
    ids = prompt(0)
    with pytest.raises(ValueError, match="batch size 2"):
        model.generate(torch.cat([ids, ids]), custom_generate=racer.generate, max_new_tokens=4)
    with pytest.raises(ValueError, match="assistant_model"):
        ours(model, ids, max_new_tokens=4, assistant_model=model)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    with pytest.raises(ValueError, match="attention_mask"):
        model.generate(ids, attention_mask=mask, custom_generate=racer.generate, max_new_tokens=4)
    embeds = model.get_input_embeddings()(ids)
    with pytest.raises(ValueError, match="inputs_embeds"):
        model.generate(inputs_embeds=embeds, custom_generate=racer.generate, max_new_tokens=4)
    cache = DynamicCache(config=model.config)
    model(input_ids=ids[:, :-1], cache=cache, use_cache=True)
    with pytest.raises(ValueError, match="cache"):
        model.generate(ids, custom_generate=racer.generate, max_new_tokens=4, cache=cache)
    with pytest.raises(TypeError, match="custom_generate"):
        racer.generate(model, ids)


def test_refused_models_are_named():
    m = plain("llama")
    m.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="attn_implementation"):
        ours(m, prompt(0), max_new_tokens=4)
    t5 = T5ForConditionalGeneration(T5Config(vocab_size=V, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=2,
                                             decoder_start_token_id=0)).eval()
    with pytest.raises(ValueError, match="encoder-decoder"):
        ours(t5, prompt(0), max_new_tokens=4)


def test_past_a_sliding_window_equals_stock():
    g = plain("gemma3")  # sliding window 96: 24 prompt tokens + 120 new ones run well past it
    ids = prompt(0)
    assert ours(g, ids, max_new_tokens=120, capacity=16).tolist() == stock(g, ids, max_new_tokens=120).tolist()


# -- drafter state across calls ---------------------------------------------------------------------

def test_drafter_state_is_kept_only_with_a_session(model, monkeypatch):
    made, fed_from = [], []
    real_make, real_run = hfg.make_drafter, hfg.DecodeRun
    monkeypatch.setattr(hfg, "make_drafter", lambda *a, **k: made.append(1) or real_make(*a, **k))
    monkeypatch.setattr(hfg, "DecodeRun", lambda *a, **k: fed_from.append(k["new_from"]) or real_run(*a, **k))
    turn1 = prompt(8)
    ours(model, turn1, max_new_tokens=20, capacity=16)
    ours(model, turn1, max_new_tokens=20, capacity=16)
    assert len(made) == 2 and fed_from == [0, 0]  # no session: a fresh drafter per call, fed everything

    made.clear()
    fed_from.clear()
    session = GenerateSession()
    out1 = ours(model, turn1, max_new_tokens=20, capacity=16, session=session)
    drafter = session.drafter
    assert session.fed == out1[0].tolist()
    turn2 = torch.cat([out1, prompt(9, 6)], dim=1)  # the chat goes on: history + a new user turn
    out2 = ours(model, turn2, max_new_tokens=20, capacity=16, session=session)
    assert torch.equal(out2, stock(model, turn2, max_new_tokens=20))
    assert len(made) == 1 and session.drafter is drafter and session.fed == out2[0].tolist()
    # Turn 2 fed the drafter only what it had not seen: the new user turn.
    assert fed_from == [0, out1.shape[1]]
    with pytest.raises(ValueError, match="session"):
        ours(model, turn2, max_new_tokens=4, capacity=16, session=session, drafter="tr")
    with pytest.raises(ValueError, match="session"):
        ours(plain("llama"), turn2, max_new_tokens=4, capacity=16, session=session)


# -- the Hub-style folder, from a local path -------------------------------------------------------

def test_custom_generate_folder_from_local_path(model):
    ids = prompt(10)
    ref = stock(model, ids, max_new_tokens=30)
    kw = dict(attention_mask=torch.ones_like(ids), custom_generate=str(ROOT), trust_remote_code=True,
              max_new_tokens=30)
    assert torch.equal(model.generate(ids, **kw), ref)
    rec = Recorder()
    out = model.generate(ids, drafter="tr", capacity=8, streamer=rec, return_dict_in_generate=True, **kw)
    assert torch.equal(out.sequences, ref) and sum(rec.puts[1:], []) == ref[0, ids.shape[1]:].tolist()
    with pytest.raises(ValueError, match="num_beams"):
        model.generate(ids, num_beams=2, **kw)
    with pytest.raises(ValueError, match="trust_remote_code"):
        model.generate(ids, **{**kw, "trust_remote_code": False})


# -- the real default model -------------------------------------------------------------------------

REAL_PROMPTS = [
    "Rename the variable `n` to `count` in this code and return it:\n\nn = 0\nfor x in items:\n    n += x\nprint(n)",
    "Summarise in one sentence: The bridge closed for repairs in May. Engineers replaced its cables and "
    "resurfaced the deck. It reopened in September, two weeks early.",
    "What is 12 times 7? Explain briefly.",
]


@pytest.mark.real_model
def test_real_model_greedy_equals_stock(real_lm):
    m, tok = real_lm.model, real_lm.tokenizer
    for text in REAL_PROMPTS:
        ids = torch.tensor([build_input_ids(tok, text)])
        for n in (1, 96):
            assert torch.equal(m.generate(ids, custom_generate=racer.generate, max_new_tokens=n),
                               m.generate(ids, max_new_tokens=n, do_sample=False)), (text, n)
    ids = torch.tensor([build_input_ids(tok, "Reply with one word: is the sky blue?")])
    ref = m.generate(ids, max_new_tokens=64, do_sample=False)
    out = m.generate(ids, custom_generate=racer.generate, max_new_tokens=64)
    assert torch.equal(out, ref)
    assert out[0, -1].item() in real_lm.eos_ids and out.shape[1] < ids.shape[1] + 64  # an end-of-sequence stop


@pytest.mark.real_model
def test_real_model_streamer_text_equals_output(real_lm):
    m, tok = real_lm.model, real_lm.tokenizer
    ids = torch.tensor([build_input_ids(tok, REAL_PROMPTS[0])])
    it = TextIteratorStreamer(tok, skip_prompt=True, skip_special_tokens=True, timeout=300)
    box = {}
    th = threading.Thread(target=lambda: box.update(out=m.generate(ids, custom_generate=racer.generate,
                                                                   max_new_tokens=80, streamer=it)))
    th.start()
    streamed = "".join(it)
    th.join()
    assert streamed == tok.decode(box["out"][0, ids.shape[1]:], skip_special_tokens=True)
    assert streamed.strip()
