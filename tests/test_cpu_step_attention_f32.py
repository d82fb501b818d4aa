"""racer's float32 step-attention kernel (AVX2): what attention computes, a query row's result depends
only on its query and the keys it sees, and with it a float32 tree forward equals one-token decoding
bit for bit."""
from __future__ import annotations

import random

import pytest
import torch
from transformers import DynamicCache

from racer.cpu import ON, attention
from racer.tiny import tiny_lm
from racer.verify import forward_tree
from tests.test_cpu_step_attention import tree_visibility
from tests.test_loop_tiny import rand_prompt, random_tree

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
    H, G, L, D = 9, 3, 300 + T, 64
    q, k, v = operands(H, G, T, L, D, seed=T)
    vis = tree_visibility(random.Random(T + 1), T, L)
    out = kernel(q, k, v, vis, 0.125)
    for t in range(T):
        seen = vis[t].nonzero().flatten()
        alone = kernel(q[:, :, t:t + 1], k[:, :, seen], v[:, :, seen], None, 0.125)
        assert torch.equal(alone[0, 0], out[0, t]), t


def test_layouts_and_threads_do_not_change_the_bits():
    H, G, T, L, D = 9, 3, 6, 200, 64
    q, k, v = operands(H, G, T, L, D, seed=7)
    vis = tree_visibility(random.Random(2), T, L)
    want = kernel(q, k, v, vis, 0.125)
    # The cache is a view of a longer buffer; the query a transposed (B, T, H, D) projection.
    kbuf, vbuf = torch.zeros(1, G, L + 40, D), torch.zeros(1, G, L + 40, D)
    kbuf[:, :, :L], vbuf[:, :, :L] = k, v
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)
    assert not qt.is_contiguous()
    assert torch.equal(kernel(qt, kbuf[:, :, :L], vbuf[:, :, :L], vis, 0.125), want)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(kernel(q, k, v, vis, 0.125), want)
    finally:
        torch.set_num_threads(before)


def test_rejects_what_it_cannot_compute():
    q, k, v = operands(4, 2, 2, 10, 64)
    with pytest.raises(RuntimeError, match="float32"):
        kernel(q.bfloat16(), k.bfloat16(), v.bfloat16(), None, 0.125)
    with pytest.raises(RuntimeError, match="head_dim"):
        kernel(q[..., :16], k[..., :16], v[..., :16], None, 0.125)
    with pytest.raises(RuntimeError, match="multiple"):
        kernel(q[:, :3], k, v, None, 0.125)
    blind = torch.ones(2, 10, dtype=torch.bool)
    blind[1] = False
    with pytest.raises(RuntimeError, match="sees no key"):
        kernel(q, k, v, blind, 0.125)
    with pytest.raises(RuntimeError, match="visible"):
        kernel(q, k, v, torch.ones(3, 10, dtype=torch.bool), 0.125)


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
    # token at a time. With PyTorch's attention instead they differ in the last bits (checked below,
    # so the equality has teeth).
    lm = tiny_lm(dtype=torch.float32, head_dim=64, seed=seed)
    rng = random.Random(seed)
    prompt = rand_prompt(rng, 70)
    tree = random_tree(rng, 5, 24, lm.vocab_size)

    def prefilled():
        cache = DynamicCache(config=lm.model.config)
        lm.model(input_ids=torch.tensor([prompt]), cache=cache, use_cache=True)
        return cache

    def differing() -> int:
        logits = forward_tree(lm.model, prefilled(), tree, len(prompt), lm.device, lm.dtype)
        n = 0
        for node in range(len(tree)):
            path, a = [], node
            while a >= 0:
                path.append(tree.tokens[a])
                a = tree.parents[a]
            cache = prefilled()
            for tok in reversed(path):
                out = lm.model(input_ids=torch.tensor([[tok]]), cache=cache, use_cache=True)
            n += not torch.equal(out.logits[0, -1], logits[node])
        return n

    with torch.inference_mode():
        assert differing() == 0
        saved = ON.step_attention
        try:
            ON.step_attention = False
            assert differing() > 0
        finally:
            ON.step_attention = saved
