"""racer's float32 step-attention kernel (AVX2): what attention computes, a query row's result depends
only on its query and the keys it sees, with it a float32 tree forward equals one-token decoding bit
for bit, and the model families that reach it (sliding windows included) get PyTorch's attention."""
from __future__ import annotations

import random

import pytest
import torch
from transformers import DynamicCache

from racer.cpu import ON, attention
from racer.tiny import tiny_lm
from tests.test_cpu_step_attention import (each_row_is_the_one_token_call, layouts_and_threads_keep_the_bits,
                                          rejects_what_it_cannot_compute, tree_nodes_unlike_one_token_decoding,
                                          tree_visibility)
from tests.test_loop_tiny import rand_prompt

pytestmark = pytest.mark.skipif(not attention.step_kernel_available(torch.float32),
                                reason="the float32 step-attention kernel needs racer's kernels built (AVX2)")


def kernel(q, k, v, visible, scale):
    return attention._step_ops(torch.float32).step_attention_f32(q, k, v, visible, scale)


def reference(q, k, v, visible, scale):
    """Attention in float64, (1, T, H, D)."""
    n = q.shape[1] // k.shape[1]
    kk, vv = k.double().repeat_interleave(n, 1), v.double().repeat_interleave(n, 1)
    s = (q.double() @ kk.transpose(-1, -2)) * scale
    return (s.masked_fill(~visible, float("-inf")).softmax(-1) @ vv).transpose(1, 2)


def operands(H, G, T, L, D, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, H, T, D, generator=g), torch.randn(1, G, L, D, generator=g),
            torch.randn(1, G, L, D, generator=g))


SHAPES = [(9, 3, 1, 600, 64), (9, 3, 5, 600, 64), (9, 3, 7, 37, 64), (8, 2, 3, 131, 128), (4, 4, 64, 300, 64),
          (6, 1, 16, 17, 64), (9, 3, 1, 1, 64), (2, 2, 2, 2, 128), (4, 2, 3, 50, 32), (4, 2, 9, 50, 96),
          # more than 64 rows: blocks of 64 with their own shared prefix (the layer sends these to PyTorch)
          (9, 3, 129, 300, 64), (8, 2, 65, 65, 128)]


@pytest.mark.parametrize("H,G,T,L,D", SHAPES)
def test_matches_attention(H, G, T, L, D):
    q, k, v = operands(H, G, T, L, D, seed=L + T)
    scale = D ** -0.5
    causal = torch.ones(T, L, dtype=torch.bool).tril(L - T)
    tree = tree_visibility(random.Random(T), T, L)
    for visible, mask in ((None, causal), (causal, causal), (tree, tree)):
        got = kernel(q, k, v, visible, scale)
        assert got.shape == (1, T, H, D) and got.dtype == torch.float32 and got.is_contiguous()
        assert torch.allclose(got.double(), reference(q, k, v, mask, scale), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("T", [2, 5, 16, 64, 100])
def test_each_row_is_the_one_token_call_over_its_keys(T):
    each_row_is_the_one_token_call(kernel, operands, T)


def test_layouts_and_threads_do_not_change_the_bits():
    layouts_and_threads_keep_the_bits(kernel, operands)


def test_rejects_what_it_cannot_compute():
    rejects_what_it_cannot_compute(kernel, operands, torch.bfloat16, "float32", 16)


def test_the_layer_sends_steps_to_it_and_prefills_to_pytorch(monkeypatch):
    lm = tiny_lm(dtype=torch.float32, head_dim=64)
    calls = []
    real = attention._step_ops(torch.float32).step_attention_f32
    monkeypatch.setattr(attention, "_step_ops", lambda *dtype: type("Spy", (), {
        "step_attention_f32": staticmethod(lambda *a: calls.append(a[0].shape[2]) or real(*a))}))
    with torch.inference_mode():
        lm.model(input_ids=torch.tensor([[1, 2, 3]]), use_cache=True)
        assert calls == [3, 3]  # two layers, a 3-token causal step each
        lm.model(input_ids=torch.tensor([list(range(attention.F32_MAX_ROWS + 1))]), use_cache=True)
        assert calls == [3, 3]  # a longer prefill: PyTorch's kernel
        monkeypatch.setattr(ON, "step_attention", False)
        lm.model(input_ids=torch.tensor([[1, 2, 3]]), use_cache=True)
    assert calls == [3, 3]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tree_logits_equal_one_token_decoding_bit_for_bit(seed):
    # The float32 forward of 1..64 tokens (tiled linear kernel, norms, rotary, this attention) is
    # batch-invariant: every node's logits in a tree forward are those of feeding its path one
    # token at a time. With PyTorch's attention instead they differ in the last bits (checked too,
    # so the equality has teeth).
    lm = tiny_lm(dtype=torch.float32, head_dim=64, seed=seed)
    assert tree_nodes_unlike_one_token_decoding(lm, seed) == 0
    saved = ON.step_attention
    try:
        ON.step_attention = False
        assert tree_nodes_unlike_one_token_decoding(lm, seed) > 0
    finally:
        ON.step_attention = saved


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3", "gemma3"])
def test_families_get_pytorchs_attention_from_it(family, monkeypatch):
    # Sliding windows (mistral, gemma3's local layers, 8 tokens here) reach the kernel as key lists
    # from the mask: a 40-token prompt, then one-token steps, against PyTorch's attention.
    lm = tiny_lm(dtype=torch.float32, head_dim=32, family=family, seed=1)
    real = attention._step_ops(torch.float32).step_attention_f32
    calls = []
    monkeypatch.setattr(attention, "_step_ops", lambda *dtype: type("Spy", (), {
        "step_attention_f32": staticmethod(lambda *a: calls.append(1) or real(*a))}))
    prompt = rand_prompt(random.Random(5), 40)

    def logits() -> torch.Tensor:
        with torch.inference_mode():
            cache = DynamicCache(config=lm.model.config)
            out = [lm.model(input_ids=torch.tensor([prompt]), cache=cache, use_cache=True).logits[0, -1]]
            for _ in range(12):
                out.append(lm.model(input_ids=out[-1].argmax().view(1, 1), cache=cache, use_cache=True).logits[0, -1])
        return torch.stack(out)

    with_kernel = logits()
    assert len(calls) == 13 * lm.model.config.num_hidden_layers
    monkeypatch.setattr(ON, "step_attention", False)
    assert torch.allclose(with_kernel, logits(), atol=1e-5, rtol=1e-5)
    assert len(calls) == 13 * lm.model.config.num_hidden_layers
