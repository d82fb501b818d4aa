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
