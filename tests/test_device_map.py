"""Models split over devices with accelerate's device_map decode through the loop: inputs go to the
first device, logits come from the last, the KV cache is compacted on each layer's own device.
On a CPU-only machine accelerate's disk offload exercises the same hooks: the offloaded layers'
weights arrive only while their forward runs."""
from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoModelForCausalLM

from racer import METHODS, DecodeConfig, decode, make_drafter
from racer.models import prepare_model
from racer.tiny import TinyTokenizer, tiny_config

V = 96


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    torch.manual_seed(0)
    cfg = tiny_config("llama", vocab=V, layers=4)
    plain = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").eval()
    with torch.no_grad():
        plain.lm_head.weight.mul_(8.0)
    folder = tmp_path_factory.mktemp("split")
    plain.save_pretrained(folder)
    device_map = {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "disk",
                  "model.layers.2": "cpu", "model.layers.3": "disk", "model.norm": "cpu", "model.rotary_emb": "cpu",
                  "lm_head": "cpu"}
    split = AutoModelForCausalLM.from_pretrained(folder, device_map=device_map, offload_folder=str(folder / "offload"),
                                                 attn_implementation="sdpa").eval()
    assert {p.device.type for p in split.parameters()} == {"cpu", "meta"}    # really offloaded
    return (prepare_model(plain, TinyTokenizer(V), linear_kernel="stock"),
            prepare_model(split, TinyTokenizer(V)))


def test_a_split_model_decodes_exactly(models):
    plain, split = models
    assert any("device map" in n for n in split.notes)
    rng = random.Random(0)
    chunk = [rng.randrange(V) for _ in range(6)]
    prompt = (chunk + [rng.randrange(V) for _ in range(3)]) * 3
    ref = decode(plain, prompt, make_drafter("ar"), DecodeConfig(max_new_tokens=32)).token_ids
    for method in METHODS:
        got = decode(split, prompt, make_drafter(method, vocab_size=V), DecodeConfig(max_new_tokens=32, capacity=12))
        assert got.token_ids == ref, method
