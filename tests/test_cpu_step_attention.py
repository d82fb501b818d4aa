"""racer's bf16 step-attention kernel: what attention computes, and a query row's result depends only
on its query and the keys it sees (so a tree forward equals one-token decoding bit for bit)."""
from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F
from transformers import DynamicCache

from racer.cpu import ON, attention
from racer.cpu.build import extension
from racer.cpu.linear import tiled_bf16_available
from racer import METHODS, DecodeConfig, decode, make_drafter
from racer.verify import forward_tree
from tests.test_loop_tiny import OracleDrafter, rand_prompt, random_tree
from racer.tiny import tiny_lm

pytestmark = pytest.mark.skipif(not (tiled_bf16_available() and hasattr(extension(), "step_attention_bf16")),
                                reason="the bf16 step-attention kernel needs a CPU with AVX512-BF16")


def kernel(q, k, v, visible, scale):
    return extension().step_attention_bf16(q, k, v, visible, scale)


def reference(q, k, v, visible, scale):
    """float32 attention of the bf16 operands, (1, T, H, D)."""
    n = q.shape[1] // k.shape[1]
    kk, vv = k.float().repeat_interleave(n, 1), v.float().repeat_interleave(n, 1)
    s = (q.float() @ kk.transpose(-1, -2)) * scale
    return (s.masked_fill(~visible, float("-inf")).softmax(-1) @ vv).transpose(1, 2)


def tree_visibility(rng: random.Random, T: int, L: int) -> torch.Tensor:
    """(T, L): the prefix before the last T keys, then each node's ancestors and itself."""
    past = L - T
    parents = [-1] + [rng.randrange(i) for i in range(1, T)]
    vis = torch.zeros(T, L, dtype=torch.bool)
    vis[:, :past] = True
    for t in range(T):
        a = t
        while a >= 0:
            vis[t, past + a] = True
            a = parents[a]
    return vis


def operands(H, G, T, L, D, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, H, T, D, generator=g).bfloat16()
    k = torch.randn(1, G, L, D, generator=g).bfloat16()
    v = torch.randn(1, G, L, D, generator=g).bfloat16()
    return q, k, v


SHAPES = [(9, 3, 1, 600, 64), (9, 3, 5, 600, 64), (9, 3, 7, 37, 64), (8, 2, 3, 131, 128), (4, 4, 64, 300, 64),
          (6, 1, 16, 17, 64), (9, 3, 1, 1, 64), (2, 2, 2, 2, 128),
          # more than 64 rows: blocks of 64, a prefill (T = L) and a chat turn's new tokens (T < L)
          (9, 3, 200, 200, 64), (9, 3, 129, 300, 64), (8, 2, 65, 65, 128)]


@pytest.mark.parametrize("H,G,T,L,D", SHAPES)
def test_matches_attention(H, G, T, L, D):
    q, k, v = operands(H, G, T, L, D, seed=L + T)
    scale = D ** -0.5
    causal = torch.ones(T, L, dtype=torch.bool).tril(L - T)
    tree = tree_visibility(random.Random(T), T, L)
    for visible, mask in ((None, causal), (causal, causal), (tree, tree)):
        got = kernel(q, k, v, visible, scale)
        want = reference(q, k, v, mask, scale)
        assert got.shape == (1, T, H, D) and got.dtype == torch.bfloat16 and got.is_contiguous()
        # bf16 operands, float32 sums, bf16 probabilities and output: within a few bf16 roundings.
        assert torch.allclose(got.float(), want, atol=1e-2, rtol=2e-2), (got.float() - want).abs().max()


def each_row_is_the_one_token_call(kernel, operands, T: int) -> None:
    """Every row of a T-token tree call equals `kernel` on that row alone over the keys it sees
    (shared with the float32 kernel's tests)."""
    H, G, L, D = 9, 3, 300 + T, 64
    q, k, v = operands(H, G, T, L, D, seed=T)
    vis = tree_visibility(random.Random(T + 1), T, L)
    out = kernel(q, k, v, vis, 0.125)
    for t in range(T):
        seen = vis[t].nonzero().flatten()
        alone = kernel(q[:, :, t:t + 1], k[:, :, seen], v[:, :, seen], None, 0.125)
        assert torch.equal(alone[0, 0], out[0, t]), t


@pytest.mark.parametrize("T", [2, 5, 16, 64])
def test_each_row_is_the_one_token_call_over_its_keys(T):
    each_row_is_the_one_token_call(kernel, operands, T)


@pytest.mark.parametrize("T,L", [(150, 150), (97, 260)])
def test_a_prefills_rows_are_its_one_token_steps(T, L):
    # Blocks of 64 rows, each with its own shared prefix: a row still sums its keys in their order,
    # so a prefill (or a chat turn's new tokens on a cache) gives the bits of feeding one token at a time.
    H, G, D = 9, 3, 64
    q, k, v = operands(H, G, T, L, D, seed=T + L)
    causal = torch.ones(T, L, dtype=torch.bool).tril(L - T)
    out = kernel(q, k, v, None, 0.125)
    assert torch.equal(kernel(q, k, v, causal, 0.125), out)
    for t in range(T):
        seen = L - T + t + 1
        alone = kernel(q[:, :, t:t + 1], k[:, :, :seen], v[:, :, :seen], None, 0.125)
        assert torch.equal(alone[0, 0], out[0, t]), t
    # A mask whose rows see different prefixes (every other key hidden from the last block's rows).
    odd = causal.clone()
    odd[-20:, 1:L - T:2] = False
    got = kernel(q, k, v, odd, 0.125)
    assert torch.allclose(got.float(), reference(q, k, v, odd, 0.125), atol=1e-2, rtol=2e-2)
    for t in (0, T - 21, T - 20, T - 1):
        seen = odd[t].nonzero().flatten()
        assert torch.equal(kernel(q[:, :, t:t + 1], k[:, :, seen], v[:, :, seen], None, 0.125)[0, 0], got[0, t]), t


def layouts_and_threads_keep_the_bits(kernel, operands):
    """A strided cache, a transposed query and one thread against two give `kernel` the same bits,
    a blocked prefill included (shared with the float32 kernel's tests)."""
    H, G, T, L, D = 9, 3, 6, 200, 64
    q, k, v = operands(H, G, T, L, D, seed=7)
    vis = tree_visibility(random.Random(2), T, L)
    want = kernel(q, k, v, vis, 0.125)
    # The cache is a view of a longer buffer; the query a transposed (B, T, H, D) projection.
    kbuf, vbuf = torch.zeros(1, G, L + 40, D, dtype=k.dtype), torch.zeros(1, G, L + 40, D, dtype=v.dtype)
    kbuf[:, :, :L], vbuf[:, :, :L] = k, v
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)
    assert not qt.is_contiguous()
    assert torch.equal(kernel(qt, kbuf[:, :, :L], vbuf[:, :, :L], vis, 0.125), want)
    prefill = operands(H, G, 140, 140, D, seed=8)
    blocked = kernel(*prefill, None, 0.125)  # three blocks of rows, tasks taken by free threads
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(kernel(q, k, v, vis, 0.125), want)
        assert torch.equal(kernel(*prefill, None, 0.125), blocked)
    finally:
        torch.set_num_threads(before)


def test_layouts_and_threads_do_not_change_the_bits():
    layouts_and_threads_keep_the_bits(kernel, operands)


def rejects_what_it_cannot_compute(kernel, operands, other_dtype, dtype_word, bad_head_dim):
    """`kernel`'s clear errors (shared with the float32 kernel's tests)."""
    q, k, v = operands(4, 2, 2, 10, 64)
    with pytest.raises(RuntimeError, match=dtype_word):
        kernel(q.to(other_dtype), k.to(other_dtype), v.to(other_dtype), None, 0.125)
    d = bad_head_dim
    with pytest.raises(RuntimeError, match="head_dim"):
        kernel(q[..., :d], k[..., :d], v[..., :d], None, 0.125)
    with pytest.raises(RuntimeError, match="multiple"):
        kernel(q[:, :3], k, v, None, 0.125)
    blind = torch.ones(2, 10, dtype=torch.bool)
    blind[1] = False
    with pytest.raises(RuntimeError, match="sees no key"):
        kernel(q, k, v, blind, 0.125)
    with pytest.raises(RuntimeError, match="visible"):
        kernel(q, k, v, torch.ones(3, 10, dtype=torch.bool), 0.125)


def test_rejects_what_it_cannot_compute():
    rejects_what_it_cannot_compute(kernel, operands, torch.float32, "bfloat16", 32)


def test_masks_it_takes_and_masks_it_leaves_to_pytorch():
    blocked = torch.finfo(torch.bfloat16).min
    additive = torch.zeros(1, 1, 3, 8, dtype=torch.bfloat16)
    additive[0, 0, 0, 6:] = blocked
    additive[0, 0, 1, 7] = blocked
    vis = attention._visible(additive, 8)
    assert vis is not None and vis.dtype == torch.bool and vis.tolist() == (additive[0, 0] == 0).tolist()
    assert torch.equal(attention._visible(additive == 0, 8), vis)  # transformers' bool masks
    biased = additive.clone()
    biased[0, 0, 2, 1] = -1.5  # a position bias: not a visibility mask
    assert attention._visible(biased, 8) is None
    assert attention._visible(additive, 9) is None
    assert attention._visible(additive.expand(2, 1, 3, 8), 8) is None

    # The attention function routes such a mask to PyTorch and the result is still attention.
    class Layer(torch.nn.Module):
        num_key_value_groups = 2
        is_causal = True
    q, k, v = operands(4, 2, 3, 8, 64, seed=3)
    got, _ = attention.tree_sdpa_forward(Layer().eval(), q, k, v, biased, scaling=0.125)
    want = F.scaled_dot_product_attention(q.float(), k.float().repeat_interleave(2, 1), v.float().repeat_interleave(2, 1),
                                          attn_mask=biased.float(), scale=0.125).transpose(1, 2)
    assert torch.allclose(got.float(), want, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_trees_visibility_is_what_its_mask_says(seed):
    # forward_tree hands the kernel the tree's visibility instead of having the mask read back.
    rng = random.Random(seed)
    tree = random_tree(rng, 5, 24, 100)
    for past in (0, 1, 37):
        mask = tree.attention_mask(past, torch.bfloat16, "cpu")
        keys = past + len(tree)
        assert torch.equal(tree.visibility(past), attention._visibility(mask, keys))
        attention.know_visibility(mask, tree.visibility(past))
        assert torch.equal(attention._visible(mask, keys), attention._visibility(mask, keys))


def test_model_uses_it_and_can_turn_it_off(monkeypatch):
    lm = tiny_lm(dtype=torch.bfloat16, head_dim=64)
    calls = []
    real = extension().step_attention_bf16
    monkeypatch.setattr(attention, "_step_ops", lambda *dtype: type("Spy", (), {
        "step_attention_bf16": staticmethod(lambda *a: calls.append(a[0].shape[2]) or real(*a))}))
    with torch.inference_mode():
        lm.model(input_ids=torch.tensor([[1, 2, 3]]), use_cache=True)
    assert calls == [3, 3]  # two layers, a 3-token causal step each
    monkeypatch.setattr(ON, "step_attention", False)
    with torch.inference_mode():
        lm.model(input_ids=torch.tensor([[1, 2, 3]]), use_cache=True)
    assert calls == [3, 3]


def tree_nodes_unlike_one_token_decoding(lm, seed: int) -> int:
    """How many nodes of a random tree get other logits in one tree forward than by feeding their
    path one token at a time (after a 70-token prefill: more than 64 rows, run in blocks)."""
    rng = random.Random(seed)
    prompt = rand_prompt(rng, 70)
    tree = random_tree(rng, 5, 24, lm.vocab_size)

    def prefilled():
        cache = DynamicCache(config=lm.model.config)
        lm.model(input_ids=torch.tensor([prompt]), cache=cache, use_cache=True)
        return cache

    with torch.inference_mode():
        logits = forward_tree(lm.model, prefilled(), tree, len(prompt), lm.device, lm.dtype)
        unlike = 0
        for node in range(len(tree)):
            path, a = [], node
            while a >= 0:
                path.append(tree.tokens[a])
                a = tree.parents[a]
            cache = prefilled()
            for tok in reversed(path):
                out = lm.model(input_ids=torch.tensor([[tok]]), cache=cache, use_cache=True)
            unlike += not torch.equal(out.logits[0, -1], logits[node])
    return unlike


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tree_logits_equal_one_token_decoding_bit_for_bit(seed):
    # The whole bf16 forward (linear kernel, norms, this attention) is batch-invariant: every
    # node's logits in a tree forward are those of feeding its path one token at a time.
    assert tree_nodes_unlike_one_token_decoding(tiny_lm(dtype=torch.bfloat16, head_dim=64, seed=seed), seed) == 0


def test_a_prompt_fed_in_pieces_gives_the_whole_prefills_logits():
    # Every bf16 kernel of the forward is batch-invariant, the prefill's attention included: a chat
    # turn fed on top of the cache computes what one prefill of the whole text would.
    lm = tiny_lm(dtype=torch.bfloat16, head_dim=64, seed=3)
    prompt = rand_prompt(random.Random(3), 150)
    with torch.inference_mode():
        whole = lm.model(input_ids=torch.tensor([prompt]), cache=DynamicCache(config=lm.model.config),
                         use_cache=True).logits[0]
        cache = DynamicCache(config=lm.model.config)
        first = lm.model(input_ids=torch.tensor([prompt[:80]]), cache=cache, use_cache=True).logits[0]
        rest = lm.model(input_ids=torch.tensor([prompt[80:]]), cache=cache, use_cache=True).logits[0]
    assert torch.equal(torch.cat([first, rest]), whole)


@pytest.mark.parametrize("seed", [4, 5])
def test_bf16_tree_decoding_equals_ar_exactly(seed):
    lm = tiny_lm(dtype=torch.bfloat16, head_dim=64, seed=seed)
    prompt = rand_prompt(random.Random(seed), 40)
    ref = decode(lm, prompt, make_drafter("ar"), DecodeConfig(max_new_tokens=60)).token_ids
    for method in METHODS:
        out = decode(lm, prompt, make_drafter(method, vocab_size=lm.vocab_size), DecodeConfig(max_new_tokens=60, capacity=24))
        assert out.token_ids == ref, method
    oracle = decode(lm, prompt, OracleDrafter(len(prompt), ref, seed), DecodeConfig(max_new_tokens=60, capacity=12))
    assert oracle.token_ids == ref
    assert oracle.mat > 1.5  # trees were accepted, so the equality had teeth
