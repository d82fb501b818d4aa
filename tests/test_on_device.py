"""Correctness on the device the tests are pointed at: RACER_TEST_DEVICE (default cpu; the GPU
check, scripts/gpu_check.sh, sets cuda). Tiny models of three families (full attention, sliding
windows, a hybrid of both) in float32 and bfloat16: greedy tree decoding equals plain greedy
decoding, or where it differs the first difference is a floating-point tie (the two tokens' logits
within the dtype's rounding of each other, measured on plain decoding's own logits, the way
racer.bench accounts for `generate()`'s ties); sampling is an exact sample of the model (chi-square).
"""
from __future__ import annotations

import os
import random

import numpy as np

import pytest
import torch
from transformers import AutoModelForCausalLM

from racer import DecodeConfig, decode, make_drafter
from racer.architecture import attention_implementation
from racer.cpu import attention_implementation as racer_attention
from racer.models import prepare_model
from racer.tiny import TinyTokenizer, tiny_config
from racer.verify import Sampling, process_logits
from tests.test_loop_tiny import FullTreeDrafter, chi2, chi2_critical

DEVICE = torch.device(os.environ.get("RACER_TEST_DEVICE", "cpu"))
V = 96
METHODS = ("ar", "pld", "tr", "racer", "racer-nochain")
#: A tie: plain decoding's logits of the two tokens within this many of the dtype's steps (at the
#: logits' magnitude) of each other.
TIE_STEPS = {torch.float32: 64, torch.bfloat16: 2}

pytestmark = pytest.mark.skipif(DEVICE.type == "cuda" and not torch.cuda.is_available(), reason="no CUDA device")


def device_lm(family: str, dtype: torch.dtype, vocab: int = V, seed: int = 0, soften: float = 1.0):
    torch.manual_seed(seed)
    cfg = tiny_config(family, vocab=vocab, layers=3)
    impl, _ = attention_implementation(cfg, "sdpa")
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=racer_attention(impl))
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0 * soften)
    return prepare_model(model.to(DEVICE, dtype).eval(), TinyTokenizer(vocab), name=f"tiny-{family}")


@torch.inference_mode()
def is_tie(lm, prompt: list[int], ref: list[int], got: list[int]) -> tuple[bool, str]:
    """Whether the first difference of `got` from `ref` is a floating-point tie of plain decoding."""
    i = next(k for k, (a, b) in enumerate(zip(ref, got)) if a != b)
    logits = lm.model(input_ids=torch.tensor([prompt + ref[:i]], device=lm.device)).logits[0, -1].float()
    gap = float(logits[ref[i]] - logits[got[i]])
    step = torch.finfo(lm.dtype).eps * max(1.0, float(logits.abs().max()))
    return gap <= TIE_STEPS[lm.dtype] * step, f"position {i}: gap {gap:.4g}, dtype step {step:.3g}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("family", ["llama", "mistral", "gemma3"])
def test_greedy_equals_plain_decoding_up_to_ties(family, dtype):
    lm = device_lm(family, dtype)
    rng = random.Random(3)
    chunk = [rng.randrange(V) for _ in range(6)]
    prompt = (chunk + [rng.randrange(V) for _ in range(4)]) * 3
    ref = decode(lm, prompt, make_drafter("ar"), DecodeConfig(max_new_tokens=32)).token_ids
    for method in METHODS:
        got = decode(lm, prompt, make_drafter(method, vocab_size=V), DecodeConfig(max_new_tokens=32, capacity=16))
        if got.token_ids != ref:
            tie, where = is_tie(lm, prompt, ref, got.token_ids)
            assert tie, f"{family} {dtype} {method}: not a tie at {where}"


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_sampling_is_exact_on_the_device(family):
    sv = 8
    lm = device_lm(family, torch.float32, vocab=sv, seed=3, soften=0.15)
    prompt = [1 + i % 7 for i in range(12)]
    s = Sampling(temperature=1.0, seed=0)

    @torch.inference_mode()
    def probs(seq):
        return process_logits(lm.model(input_ids=torch.tensor([seq], device=lm.device)).logits[0, -1], s).double().cpu()

    exact = np.zeros((sv, sv))
    p1 = probs(prompt)
    for a in range(sv):
        p2 = probs(prompt + [a])
        for b in range(sv):
            exact[b] += float(p1[a] * p2[b]) * probs(prompt + [a, b]).numpy()
    counts = np.zeros((sv, sv))
    for i in range(1500):
        cfg = DecodeConfig(max_new_tokens=3, capacity=64, temperature=1.0, seed=1000 + i)
        out = decode(lm, prompt, FullTreeDrafter(), cfg).token_ids
        counts[out[1], out[2]] += 1
    stat, df = chi2(counts, exact)
    assert stat < chi2_critical(df), (family, stat, df)
