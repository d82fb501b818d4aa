"""racer.cpu.attention's tree attention computes what transformers' sdpa and eager paths compute."""
from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F
from transformers import DynamicCache

from racer.cpu import attention
from racer.verify import forward_tree
from tests.test_loop_tiny import rand_prompt, random_tree
from racer.tiny import tiny_lm


def tree_logits(attn: str, heads: int, kv_heads: int, size: int, spy=None) -> torch.Tensor:
    """The tree's logits after a 15-token prefill; `spy` (if given) replaces the attention's
    `F.scaled_dot_product_attention` once the model is built (its load check runs forwards too)."""
    lm = tiny_lm(attn=attn)
    if (heads, kv_heads) != (4, 2):  # rebuild with another head layout, same seed
        from transformers import LlamaConfig, LlamaForCausalLM
        torch.manual_seed(0)
        cfg = LlamaConfig(vocab_size=lm.vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=512)
        cfg._attn_implementation = attention.register() if attn == "sdpa" else attn
        lm.model = LlamaForCausalLM(cfg).eval()
    if spy is not None:
        spy()
    rng = random.Random(3)
    prompt = rand_prompt(rng, 15)
    with torch.inference_mode():
        cache = DynamicCache(config=lm.model.config)
        lm.model(input_ids=torch.tensor([prompt]), cache=cache, use_cache=True)
        tree = random_tree(random.Random(size), 7, size, lm.vocab_size)
        return forward_tree(lm.model, cache, tree, len(prompt), lm.device, lm.dtype)


@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (4, 1), (4, 4)])
@pytest.mark.parametrize("size", [1, 2, 7, 24])
def test_same_logits_as_eager(heads, kv_heads, size):
    ours = tree_logits("sdpa", heads, kv_heads, size)  # tiny_lm maps "sdpa" to racer_sdpa, as load_model does
    eager = tree_logits("eager", heads, kv_heads, size)
    assert torch.allclose(ours, eager, atol=1e-5)


def test_packed_path_runs_for_gqa_trees(monkeypatch):
    seen = []
    real = F.scaled_dot_product_attention

    def spy(q, *a, **k):
        seen.append(tuple(q.shape))
        return real(q, *a, **k)

    def watch():
        monkeypatch.setattr(attention.F, "scaled_dot_product_attention", spy)
    tree_logits("sdpa", 4, 2, 7, spy=watch)
    # The 15-token prefill (causal, 4 query heads), then the tree: 2 layers, 2 key/value
    # heads, 2 query heads each folded into the rows: 2 * 7 rows.
    assert seen == [(1, 4, 15, 16)] * 2 + [(1, 2, 14, 16)] * 2
    monkeypatch.undo()
    seen.clear()
    tree_logits("sdpa", 4, 2, 1, spy=watch)
    # One token and no mask: its 2 query heads per key/value head become 2 rows.
    assert seen == [(1, 4, 15, 16)] * 2 + [(1, 2, 2, 16)] * 2


def test_registered_and_used_by_load_path():
    assert attention.register() == attention.NAME
    lm = tiny_lm()
    assert lm.model.config._attn_implementation == attention.NAME


@pytest.mark.parametrize("seed", range(4))
def test_the_inputs_kernel_builds_what_the_tree_builds(seed):
    """racer's kernel for a tree's forward inputs (csrc/tree_inputs.cpp) against DraftTree's own
    ids, positions, visibility and additive mask, bit for bit, for every floating dtype."""
    from racer.cpu.build import extension
    from racer.tree import DraftTree

    ops = extension()
    if ops is None:
        pytest.skip("racer's CPU kernels are not built here")
    rng = random.Random(seed)
    for size in (1, 2, 5, 9, 24):
        tree = random_tree(rng, rng.randrange(1000), size, 1000)
        for past in (0, 1, 37):
            for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
                ids, pos, visible, mask = ops.tree_inputs(tree.tokens, tree.parents, past, dtype)
                want = tree.visibility(past)
                assert ids.tolist() == [tree.tokens]
                assert torch.equal(pos, tree.position_ids(past, "cpu"))
                assert visible.dtype == torch.bool and torch.equal(visible, want)
                assert mask.dtype == dtype and torch.equal(mask, DraftTree.additive_mask(want, dtype))
                assert torch.equal(mask, tree.attention_mask(past, dtype, "cpu"))
    with pytest.raises(RuntimeError, match="not topological"):
        ops.tree_inputs([1, 2, 3], [-1, 2, 0], 4, torch.float32)
    with pytest.raises(RuntimeError, match="floating mask dtype"):
        ops.tree_inputs([1, 2], [-1, 0], 4, torch.int32)


def test_tree_logits_are_the_same_with_the_inputs_kernel_and_without(monkeypatch):
    from racer import verify
    from racer.cpu.switches import ON

    if verify._inputs_kernel(verify.FULL_ONLY, "cpu", torch.float32) is None:
        pytest.skip("racer's CPU kernels are not built here")
    calls = []
    real = verify._inputs_kernel
    monkeypatch.setattr(verify, "_inputs_kernel", lambda *a: calls.append(real(*a)) or calls[-1])
    with_kernel = tree_logits("sdpa", 4, 2, 9)
    assert calls and all(c is not None for c in calls)  # the tree's inputs came from the kernel
    monkeypatch.setattr(ON, "rows", False)
    assert verify._inputs_kernel(verify.FULL_ONLY, "cpu", torch.float32) is None
    assert torch.equal(with_kernel, tree_logits("sdpa", 4, 2, 9))
