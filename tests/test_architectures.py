"""The architecture matrix: tree decoding is exact on every popular decoder family, on tiny random
models built offline (racer.tiny.FAMILIES), with prompts longer than the sliding windows.

For each family: the logits at every node of random trees equal sequential decoding of the node's
branch (float32, within 1e-4 of the logits' scale); every drafter's greedy output equals plain
greedy decoding at capacities 4, 16 and 64; where racer's decoder-layer forward runs, it gives
the module path's logits bit for bit. Sampling stays an exact sample of the model on two families
(a chi-square test). Test ids name the family.
"""
from __future__ import annotations

import random

import pytest
import torch

from racer import METHODS, DecodeConfig, decode, make_drafter
from racer.cpu import ON, layers
from racer.kvcache import new_cache
from racer.models import ModelLoadError, prepare_model
from racer.tiny import FAMILIES, WINDOW, TinyTokenizer, tiny_config, tiny_lm
from racer.tree import DraftTree
from racer.verify import Sampling, forward_tree, keep_path
from tests.test_loop_tiny import chi2, chi2_critical, empirical, joint_probs

V = 96
PROMPT = 3 * WINDOW + 5          # every query reaches past the sliding windows
FAMILY_IDS = list(FAMILIES)


@pytest.fixture(scope="module", params=FAMILY_IDS)
def family_lm(request):
    return request.param, tiny_lm(vocab=V, family=request.param, layers=3)


def repetitive_prompt(rng: random.Random, n: int) -> list[int]:
    chunk = [rng.randrange(V) for _ in range(5)]
    out: list[int] = []
    while len(out) < n:
        out += chunk if rng.random() < 0.6 else [rng.randrange(V)]
    return out[:n]


def bushy_tree(rng: random.Random, root: int, size: int) -> DraftTree:
    t = DraftTree.root_only(root)
    while len(t) < size:
        t.add(rng.randrange(len(t)), rng.randrange(V), "logits")
    return t


@torch.inference_mode()
def sequential_logits(lm, prompt: list[int], tree: DraftTree) -> torch.Tensor:
    """Each node's logits from a plain forward of its whole branch (the model's own masks)."""
    rows = []
    for node in range(len(tree)):
        branch = prompt + [tree.tokens[i] for i in tree.path_to(node)]
        rows.append(lm.model(input_ids=torch.tensor([branch])).logits[0, -1])
    return torch.stack(rows)


@torch.inference_mode()
def test_tree_logits_equal_sequential_decoding(family_lm):
    family, lm = family_lm
    rng = random.Random(sum(map(ord, family)))
    prompt = repetitive_prompt(rng, PROMPT)
    for size in (1, 3, 9, 17):
        tree = bushy_tree(rng, rng.randrange(V), size)
        if size == 3:
            tree = DraftTree.root_only(tree.tokens[0])
            tree.add_path([rng.randrange(V), rng.randrange(V)], "lookup")   # a chain: the model's own mask
        cache = new_cache(lm.model)
        lm.model(input_ids=torch.tensor([prompt]), cache=cache, use_cache=True)
        got = forward_tree(lm.model, cache, tree, len(prompt), lm.device, lm.dtype, lm.layout)
        want = sequential_logits(lm, prompt, tree)
        scale = float(want.abs().max())
        assert float((got - want).abs().max()) <= 1e-4 * max(1.0, scale), (family, size)
        # The cache the tree forward wrote serves the next one: a second tree after the first.
        keep = tree.path_to(len(tree) - 1)
        keep_path(cache, len(prompt), keep, len(tree))
        prefix = prompt + [tree.tokens[i] for i in keep]
        nxt = bushy_tree(rng, rng.randrange(V), 6)
        got = forward_tree(lm.model, cache, nxt, len(prefix), lm.device, lm.dtype, lm.layout)
        want = sequential_logits(lm, prefix, nxt)
        assert float((got - want).abs().max()) <= 1e-4 * max(1.0, float(want.abs().max())), (family, size, "next")


@pytest.mark.parametrize("capacity", [4, 16, 64])
def test_every_drafter_equals_plain_greedy(family_lm, capacity):
    family, lm = family_lm
    prompt = repetitive_prompt(random.Random(capacity), PROMPT)
    ref = decode(lm, prompt, make_drafter("ar"), DecodeConfig(max_new_tokens=40)).token_ids
    accepted = 0
    for method in METHODS:
        res = decode(lm, prompt, make_drafter(method, vocab_size=V), DecodeConfig(max_new_tokens=40, capacity=capacity))
        assert res.token_ids == ref, (family, method, capacity)
        accepted += res.new_tokens - (res.forwards - 1)
    assert accepted > 0, "no draft was ever accepted: the equality proves little"


@torch.inference_mode()
def test_the_fast_layer_is_bit_identical_where_it_runs(family_lm):
    family, lm = family_lm
    if not layers.count(lm.model):
        assert not any("decoder-layer forward" in n for n in lm.notes)
        pytest.skip(f"{family} runs transformers' own decoder layers (the load notes say so)")
    assert any("decoder-layer forward" in n for n in lm.notes)
    rng = random.Random(7)
    prompt = repetitive_prompt(rng, PROMPT)
    tree = bushy_tree(rng, 3, 12)

    def run():
        cache = new_cache(lm.model)
        lm.model(input_ids=torch.tensor([prompt]), cache=cache, use_cache=True)
        return forward_tree(lm.model, cache, tree, len(prompt), lm.device, lm.dtype, lm.layout)
    fast = run()
    ON.fast_layer = False
    try:
        slow = run()
    finally:
        ON.fast_layer = True
    assert torch.equal(fast, slow), family


@pytest.mark.parametrize("family", ["gemma3", "gpt2"])
def test_sampling_stays_exact(family):
    """The chi-square test of tests/test_loop_tiny.py on a windowed hybrid and on learned positions,
    with a prompt past the window."""
    sv = 8
    lm = tiny_lm(vocab=sv, seed=3, family=family)
    with torch.no_grad():
        lm.model.get_output_embeddings().weight.mul_(0.15)   # soften: many outcomes with real mass
    prompt = [1 + i % 7 for i in range(WINDOW + 3)]
    s = Sampling(temperature=1.0, seed=0)
    probs = joint_probs(lm, prompt, s)
    stat, df = chi2(empirical(lm, prompt, s, 2000), probs)
    assert stat < chi2_critical(df), (family, stat, df)


def test_a_model_past_its_window_decodes_a_long_prompt():
    """Context is the model's own (not the window): a prompt many windows long runs exactly."""
    lm = tiny_lm(vocab=V, family="gemma3", max_context=4096)
    prompt = repetitive_prompt(random.Random(1), 40 * WINDOW)
    ref = decode(lm, prompt, make_drafter("ar"), DecodeConfig(max_new_tokens=24)).token_ids
    got = decode(lm, prompt, make_drafter("racer", vocab_size=V), DecodeConfig(max_new_tokens=24, capacity=16))
    assert got.token_ids == ref and lm.max_context == 4096


def test_text_config_limits_are_read():
    from racer.architecture import AttentionLayout, context_limit
    from transformers import Gemma3Config
    cfg = Gemma3Config(text_config=tiny_config("gemma3").to_dict(), vision_config={"hidden_size": 32,
                       "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 32, "image_size": 28,
                       "patch_size": 14})
    assert context_limit(cfg) == 512
    assert AttentionLayout.of(cfg).window == WINDOW


def test_an_architecture_the_loop_cannot_run_is_refused_at_load():
    from transformers import AttentionInterface, AutoModelForCausalLM
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def causal_only(module, q, k, v, mask, **kw):
        # An attention that ignores the mask it is given: trees would silently attend to siblings.
        return sdpa_attention_forward(module, q, k, v, None, is_causal=q.shape[2] > 1, **kw)
    AttentionInterface.register("causal_only_test", causal_only)
    cfg = tiny_config("llama")
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="causal_only_test").eval()
    with pytest.raises(ModelLoadError, match="cannot take a tree mask"):
        prepare_model(model, TinyTokenizer(V))
    # Registered under a name the loop accepts, the check at load still catches it.
    model.config._attn_implementation = "sdpa"
    AttentionInterface.register("sdpa", causal_only)
    try:
        with pytest.raises(ModelLoadError, match="does not reproduce sequential decoding"):
            prepare_model(model, TinyTokenizer(V), linear_kernel="stock")
    finally:
        AttentionInterface.register("sdpa", sdpa_attention_forward)
    cfg = tiny_config("llama")
    cfg.layer_types = ["full_attention", "linear_attention"]
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").eval()
    with pytest.raises(ModelLoadError, match="linear_attention"):
        prepare_model(model, TinyTokenizer(V))
