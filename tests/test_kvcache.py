"""racer.kvcache.GrowingCache holds what DynamicCache holds, without re-copying it per step,
and the prefill's reduced top-k fills the copy-logit table exactly as the full one did."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from transformers import DynamicCache

import racer.kvcache as kvcache
from racer import DecodeConfig, DecodeRun, make_drafter
from racer.copylogit import CopyLogitStore
from racer.loop import last_occurrences
from racer.verify import accept_greedy, forward_tree, keep_path
from tests.test_loop_tiny import rand_prompt, random_tree
from racer.tiny import tiny_lm


@pytest.fixture(scope="module")
def lm():
    return tiny_lm()


def test_same_logits_and_entries_as_dynamic_cache_through_growth(lm, monkeypatch):
    # A tiny headroom forces many reallocations in 40 steps.
    monkeypatch.setattr(kvcache, "HEADROOM", 3)
    rng = random.Random(0)
    prompt = rand_prompt(rng, 20)
    with torch.inference_mode():
        caches = [DynamicCache(config=lm.model.config), kvcache.new_cache(lm.model)]
        for c in caches:
            lm.model(input_ids=torch.tensor([prompt]), cache=c, use_cache=True)
        past, root = len(prompt), prompt[-1]
        for step in range(40):
            tree = random_tree(rng, root, rng.randrange(1, 12), lm.vocab_size)
            outs = [forward_tree(lm.model, c, tree, past, lm.device, lm.dtype) for c in caches]
            assert torch.allclose(outs[0], outs[1], atol=1e-5), step
            # Accept a random root-to-node path (not always contiguous) to exercise compaction.
            path = tree.path_to(rng.randrange(len(tree)))
            for c in caches:
                keep_path(c, past, path, len(tree))
            past += len(path)
            root = accept_greedy(tree, outs[0])[1]
            for a, b in zip(caches[0].layers, caches[1].layers):
                assert b.get_seq_length() == a.get_seq_length() == past
                assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
    grown = caches[1].layers[0]
    assert isinstance(grown, kvcache.GrowingLayer) and grown.capacity >= past


def test_append_writes_in_place_and_crop_only_moves_the_length(lm):
    with torch.inference_mode():
        cache = kvcache.new_cache(lm.model)
        lm.model(input_ids=torch.tensor([list(range(10))]), cache=cache, use_cache=True)
        layer = cache.layers[0]
        buf = layer._k.data_ptr()
        first = layer.keys[..., :10, :].clone()
        lm.model(input_ids=torch.tensor([[11, 12, 13]]), cache=cache, use_cache=True)
        assert layer._k.data_ptr() == buf and cache.get_seq_length() == 13
        assert torch.equal(layer.keys[..., :10, :], first)
        cache.crop(-2)
        assert cache.get_seq_length() == 11 and layer.keys.shape[-2] == 11 and layer._k.data_ptr() == buf
        with pytest.raises(ValueError):
            cache.crop(3)
        cache.reset()
        assert cache.get_seq_length() == 0


@pytest.mark.skipif(kvcache.extension() is None, reason="racer's CPU kernels are not built here")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compaction_kernel_moves_the_path_down_in_every_layer(lm, dtype):
    """One kernel call does what keep_path's PyTorch ops do per tensor; it refuses a path that
    does not increase (moving rows down in place is only safe in path order)."""
    cache = kvcache.new_cache(lm.model)
    gen = torch.Generator().manual_seed(0)
    for layer in cache.layers:
        layer.lazy_initialization(torch.zeros(1), torch.zeros(1))
        layer._k = torch.randn(1, 2, 40, 8, generator=gen).to(dtype)
        layer._v = torch.randn(1, 2, 40, 8, generator=gen).to(dtype)
        layer.length = 30
    past, path = 20, [0, 3, 4, 8]
    want = [(l._k.clone(), l._v.clone()) for l in cache.layers]
    for k, v in want:
        src = torch.tensor(path) + past
        k[..., past:past + len(path), :] = k.index_select(-2, src)
        v[..., past:past + len(path), :] = v.index_select(-2, src)
    assert cache.compact(past, path)
    for layer, (k, v) in zip(cache.layers, want):
        assert torch.equal(layer._k, k) and torch.equal(layer._v, v)
    with pytest.raises(RuntimeError, match="increase"):
        cache.compact(past, [0, 2, 2])


@pytest.mark.parametrize("method", ["racer", "tr", "ar"])
def test_decode_matches_dynamic_cache_decode(lm, monkeypatch, method):
    prompt = rand_prompt(random.Random(5), 30)
    cfg = DecodeConfig(max_new_tokens=40, capacity=8)

    def run():
        r = DecodeRun(lm, prompt, make_drafter(method, vocab_size=lm.vocab_size), cfg)
        steps = [(rec.tree.tokens, rec.accepted) for rec in r]
        return r.result.token_ids, steps

    ours = run()
    monkeypatch.setattr("racer.loop.new_cache", lambda m: DynamicCache(config=m.config))
    assert run() == ours


def test_last_occurrences():
    assert last_occurrences([5, 1, 5, 2, 1, 7], 0) == [2, 3, 4, 5]
    assert last_occurrences([5, 1, 5, 2, 1, 7], 3) == [0, 1, 2]
    assert last_occurrences([4, 4, 4], 1) == [1]
    assert last_occurrences([1, 2], 2) == []


def test_prefill_fills_the_copy_logit_table_as_a_full_top_k_would(lm):
    rng = random.Random(9)
    # Repeated chunks: many tokens occur several times. Token 0 is the tiny model's padding index
    # (a zero embedding): its logits all tie, and ties have no one top-k order, so it stays out.
    prompt = [t or 1 for t in rand_prompt(rng, 60)]
    assert len(set(prompt)) < len(prompt)
    drafter = make_drafter("racer", vocab_size=lm.vocab_size)
    run = DecodeRun(lm, prompt, drafter, DecodeConfig(max_new_tokens=1, capacity=1))
    next(iter(run))
    with torch.inference_mode():
        logits = lm.model(input_ids=torch.tensor([prompt])).logits[0]
    full = CopyLogitStore(lm.vocab_size, drafter.k)
    full.write(np.asarray(prompt), logits.topk(drafter.k, dim=-1).indices.numpy())
    assert np.array_equal(drafter.store.table, full.table)
