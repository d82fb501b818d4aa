"""Drafters without a model: copy-logit expansion, Token Recycling, RACER merging, registry."""
from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from racer.copylogit import CopyLogitStore, write_tree_rows
from racer.drafters import METHODS, make_drafter
from racer.drafters.base import Verified
from racer.drafters.pld import PLDDrafter
from racer.drafters.tr import TEMPLATE_PATH, load_template
from racer.tree import DraftTree

V, K = 5000, 8


def full_table(v: int = V, k: int = K, seed: int = 0) -> np.ndarray:
    """Every row distinct within itself (like a real top-k), all rows filled."""
    rng = np.random.default_rng(seed)
    return np.stack([rng.choice(v, size=k, replace=False) for _ in range(v)]).astype(np.int32)


def full_store(v: int = V, k: int = K) -> CopyLogitStore:
    store = CopyLogitStore(v, k)
    store.write(np.arange(v), full_table(v, k))
    return store


def per_depth(exp) -> dict[int, Counter]:
    out: dict[int, Counter] = {}
    for d, b in zip(exp.depths, exp.breadths):
        out.setdefault(d, Counter())[b] += 1
    return out


# ---------------------------------------------------------------------------- copy-logit

def test_paper_rule_breadths_by_hand():
    exp = full_store().expand(7, 10_000, "paper")
    assert exp.breadths[:8] == [8, 4, 2, 1, 1, 1, 1, 1]
    levels = per_depth(exp)
    # Depth 2: the breadth-8 child (non-root, halves from j = 0) gives 4,2,1,1,1,1,1,1; the
    # breadth-4 child 2,1,1,1; the breadth-2 child 1,1; five breadth-1 children one 1 each.
    assert levels[2] == Counter({4: 1, 2: 2, 1: 16})
    assert levels[3] == Counter({2: 1, 1: 23})        # 4 + 2*2 + 16 nodes
    assert sum(levels[4].values()) == 2 + 23
    # Below the breadth-8 first child halving starts at j = 0: 8 >> 1, 8 >> 2, ...
    first_kids = [i for i, p in enumerate(exp.parents) if p == 0]
    assert [exp.breadths[i] for i in first_kids] == [4, 2, 1, 1, 1, 1, 1, 1]
    assert [exp.ranks[i] for i in first_kids] == list(range(8))


def test_released_rule_halves_at_root():
    exp = full_store().expand(7, 10_000, "released")
    assert exp.breadths[:8] == [4, 2, 1, 1, 1, 1, 1, 1]
    levels = per_depth(exp)
    assert levels[2] == Counter({2: 1, 1: 11})        # 4 + 2 + 6
    assert sum(levels[3].values()) == 2 + 11


def test_expand_is_bfs_and_respects_capacity():
    store = full_store()
    for cap in (0, 1, 5, 63, 200):
        exp = store.expand(11, cap)
        assert len(exp) == cap
        assert exp.depths == sorted(exp.depths)
        assert all(p < i for i, p in enumerate(exp.parents))
        assert all(exp.depths[i] == (1 if p < 0 else exp.depths[p] + 1) for i, p in enumerate(exp.parents))
    table = store.table
    exp = store.expand(11, 63)
    for i, (tok, p, r) in enumerate(zip(exp.tokens, exp.parents, exp.ranks)):
        parent_tok = 11 if p < 0 else exp.tokens[p]
        assert table[parent_tok, r] == tok
    # Paper rule, K = 8, capacity 63: levels of 8, 19, 24 then 12 of the fourth.
    assert Counter(exp.depths) == Counter({1: 8, 2: 19, 3: 24, 4: 12})


def test_empty_rows_do_not_expand():
    store = CopyLogitStore(100, K)
    assert len(store.expand(3, 64)) == 0
    store.write([3], np.array([[10, 11, 12, -1, -1, -1, -1, -1]]))
    exp = store.expand(3, 64)
    assert exp.tokens == [10, 11, 12] and exp.parents == [-1, -1, -1]
    store.write([10], np.array([[20, 21, 22, 23, 24, 25, 26, 27]]))
    exp = store.expand(3, 64)
    assert exp.tokens == [10, 11, 12] + list(range(20, 28))    # the first child keeps breadth 8
    assert exp.breadths == [8, 4, 2] + [4, 2, 1, 1, 1, 1, 1, 1]
    assert len(store.expand(3, 64, "released")) == 3 + 4          # released: first child breadth 4
    assert len(store) == 2


def test_write_last_occurrence_wins_and_refreshes_cache():
    store = CopyLogitStore(50, 4)
    store.write([5, 7], np.array([[1, 2, 3, 4], [9, 9, 9, 9]]))
    assert store.row(5) == [1, 2, 3, 4]
    store.write(np.array([5, 7, 5]), np.array([[11, 12, 13, 14], [21, 22, 23, 24], [31, 32, 33, 34]]))
    assert store.row(5) == [31, 32, 33, 34]
    assert store.row(7) == [21, 22, 23, 24]
    assert store.table[5].tolist() == [31, 32, 33, 34]
    # Wider topk is cut to K, narrower is padded with empties; ids beyond V grow the table.
    store.write([6], np.arange(10)[None])
    store.write([60], np.array([[1, 2]]))
    assert store.row(6) == [0, 1, 2, 3] and store.row(60) == [1, 2] and store.vocab_size >= 61


def test_write_tree_rows_prefers_accepted_nodes():
    store = CopyLogitStore(50, 2)
    tokens = [1, 4, 4, 5]            # token 4 at a rejected node (1) and an accepted one (2)
    topk = np.array([[4, 0], [8, 8], [9, 9], [7, 7]])
    write_tree_rows(store, tokens, topk, accepted=[0, 2])
    assert store.row(4) == [9, 9] and store.row(5) == [7, 7] and store.row(1) == [4, 0]


@pytest.mark.parametrize("seed", range(6))
def test_the_store_kernel_writes_a_tree_s_rows_as_numpy_does(seed, monkeypatch):
    """racer's CPU kernel (csrc/store_rows.cpp) against the numpy path, on random trees with
    repeated tokens, missing ids (-1), no ids at some nodes, top-k wider and narrower than the
    store, with and without probabilities; the cached row lists must follow the write."""
    from racer.copylogit import _store_kernel
    from racer.cpu.switches import ON

    if _store_kernel() is None:
        pytest.skip("racer's CPU kernels are not built here")
    rng = np.random.default_rng(seed)
    for trial in range(20):
        k_store, k = int(rng.integers(1, 9)), int(rng.integers(1, 11))
        n = int(rng.integers(1, 20))
        tokens = [int(t) for t in rng.integers(-1, 30, n)]
        topk = rng.integers(-1, 60, (n, k)).astype(np.int64)
        probs = rng.random((n, k)).astype(np.float32) if trial % 3 else None
        accepted = sorted({0, *map(int, rng.integers(-2, n + 2, int(rng.integers(0, 5))))})
        init = rng.integers(-1, 64, (64, k_store)), rng.random((64, k_store)).astype(np.float32)
        stores = []
        for kernel in (True, False):
            monkeypatch.setattr(ON, "rows", kernel)
            store = CopyLogitStore(64, k_store)
            store.write(np.arange(64), *init)
            [(store.row(t), store.row_p(t)) for t in range(64)]  # cached lists the write must drop
            write_tree_rows(store, tokens, topk, accepted, probs)
            stores.append(store)
        a, b = stores
        np.testing.assert_array_equal(a.table, b.table)
        np.testing.assert_array_equal(a.probs, b.probs)
        assert [a.row(t) for t in range(64)] == [b.row(t) for t in range(64)]
        assert [a.row_p(t) for t in range(64)] == [b.row_p(t) for t in range(64)]


# ---------------------------------------------------------------------------- Token Recycling

def template_paths() -> list[list[int]]:
    with open(TEMPLATE_PATH, encoding="utf-8") as f:
        return json.load(f)["paths"]


def test_tr_template_matches_json_paths():
    paths = template_paths()
    assert len(paths) == len(load_template()) == 80
    d = make_drafter("tr", vocab_size=V)
    table = full_table()
    d.store.write(np.arange(V), table)
    tree = d.propose([], 42, 1 + len(paths))
    tree.validate()
    assert len(tree) == 81 and set(tree.sources[1:]) == {"template"}
    for i, p in enumerate(paths, start=1):
        tok = 42
        for r in p:
            tok = int(table[tok, r])
        assert tree.tokens[i] == tok and tree.ranks[i] == p[-1] and tree.depths[i] == len(p)
        assert tree.path_to(i)[:-1] == tree.path_to(tree.parents[i])
    small = d.propose([], 42, 20)
    assert len(small) == 20 and small.tokens == tree.tokens[:20] and small.parents == tree.parents[:20]


def test_tr_skips_empty_entries_with_subtree():
    d = make_drafter("tr", vocab_size=100)
    d.store.write([1], np.array([[2, 3, 4, -1, -1, -1, -1, -1]]))
    d.store.write([2], np.array([[5, -1, -1, -1, -1, -1, -1, -1]]))
    tree = d.propose([], 1, 80)
    tree.validate()
    assert tree.tokens == [1, 2, 3, 4, 5]
    assert tree.parents == [-1, 0, 0, 0, 1]


def test_tr_updates_from_all_tree_nodes():
    d = make_drafter("tr", vocab_size=100)
    d.start([1, 2, 3], 0, np.array([[2] * 8, [3] * 8, [4] * 8]))
    assert d.store.row(3) == [4] * 8
    tree = DraftTree.root_only(4)
    tree.add(0, 10, "template")
    tree.add(0, 11, "template")
    topk = np.array([[10] * 8, [50] * 8, [60] * 8])
    d.observe(Verified(tree, topk, [0], [4], 10, [1, 2, 3, 4]))
    assert d.store.row(11) == [60] * 8 and d.store.row(10) == [50] * 8   # rejected nodes too


# ---------------------------------------------------------------------------- RACER

def synthetic_run(method: str, steps: int = 30, capacity: int = 32, seed: int = 1,
                  prime: bool = False, **opts):
    """Drive a drafter on a stream of a repeated phrase and fresh random stretches, with a
    fake model whose top-k depends on the last token only. `prime` fills every copy-logit
    row first (as after a long history). Returns the drafter and (tree, observe result) per
    step."""
    rng = np.random.default_rng(seed)
    vocab = 300
    model = full_table(vocab, K, seed=seed + 7)
    phrase = rng.integers(0, vocab, size=25).tolist()
    # The fake model knows the phrase (rank 0 = the phrase's next token), so both sources
    # can propose the same continuation.
    for t, nxt in zip(phrase, phrase[1:]):
        row = model[t]
        hit = np.flatnonzero(row == nxt)
        row[hit[0] if hit.size else 0] = row[0]
        row[0] = nxt
    stream = []
    for _ in range(40):
        stream += phrase + rng.integers(0, vocab, size=15).tolist()
    d = make_drafter(method, vocab_size=vocab, **opts)
    ctx = stream[:60]
    d.start(ctx, 0, model[np.array(ctx)] if d.wants_topk else None)
    if prime and d.wants_topk:
        d.store.write(np.arange(vocab), model)
    pos, root = 60, stream[60]
    out = []
    for _ in range(steps):
        tree = d.propose(ctx, root, capacity)
        # "Verify": accept the longest path agreeing with the stream.
        acc, node = [0], 0
        while True:
            nxt = tree.child(node, stream[pos + len(acc)])
            if nxt < 0:
                break
            acc.append(nxt)
            node = nxt
        committed = [tree.tokens[i] for i in acc]
        ctx = ctx + committed
        pos += len(acc)
        root = stream[pos]
        topk = model[np.array(tree.tokens)] if d.wants_topk else None
        res = d.observe(Verified(tree, topk, acc, committed, root, ctx))
        out.append((tree, res))
    return d, out


@pytest.mark.parametrize("method", METHODS)
def test_trees_valid_and_within_capacity(method):
    for cap in (1, 2, 16, 64):
        _, steps = synthetic_run(method, steps=15, capacity=cap)
        for tree, res in steps:
            tree.validate()
            assert len(tree) <= cap
            if method.startswith("racer"):
                info = tree.info
                counts = Counter(tree.sources[1:])
                assert (info["n_retrieval"], info["n_logits"], info["n_both"]) == (
                    counts["retrieval"], counts["logits"], counts["both"])
                assert set(res) == {"evicted", "accepted_by_source", "automaton_size"}
                json.dumps(info)


def test_racer_merge_fills_capacity_and_marks_both():
    _, steps = synthetic_run("racer", steps=40, capacity=64, prime=True)
    assert all(len(t) == 64 for t, _ in steps)   # a full table always fills the budget
    assert any(t.info["n_both"] > 0 for t, _ in steps)
    assert any(t.info["n_retrieval"] > 0 for t, _ in steps)
    assert sum(sum(r["accepted_by_source"].values()) for _, r in steps) > 0


def test_racer_both_source_by_hand():
    d = make_drafter("racer", vocab_size=100)
    ctx = [1, 2, 3, 4, 5, 1, 2]
    d.start(ctx, 0, None)
    d.store.write([3], np.array([[4, 90, 91, 92, 93, 94, 95, 96]]))
    # Room for the lookup chain (which repeats 4 5 1 2 3 ... up to 16 deep) and the logits.
    tree = d.propose(ctx, 3, 40)
    tree.validate()
    n4 = tree.child(0, 4)
    assert tree.sources[n4] == "both"
    assert tree.meta[n4]["freq"] >= 1 and tree.meta[n4]["breadth"] == 8
    assert tree.sources[tree.child(n4, 5)] == "retrieval"
    assert tree.sources[tree.child(0, 90)] == "logits"
    assert tree.info["match_depth"] == 3
    assert tree.info["borders"][0] == {"node": tree.info["borders"][0]["node"], "depth": 3, "tokens": [1, 2, 3]}


def test_racer_half_split():
    cap = 33
    _, steps = synthetic_run("racer-half", steps=30, capacity=cap)
    for tree, _ in steps:
        i = tree.info
        assert i["n_retrieval"] + i["n_both"] <= (cap - 1) // 2
        assert i["n_logits"] + i["n_both"] <= cap - 1 - (cap - 1) // 2
    assert any(t.info["n_retrieval"] > 0 for t, _ in steps)


def test_racer_hard_logits_only_without_retrieval():
    _, steps = synthetic_run("racer-hard", steps=40, capacity=32)
    kinds = set()
    for tree, _ in steps:
        src = set(tree.sources[1:])
        assert "both" not in src and src != {"retrieval", "logits"}
        kinds.add(frozenset(src))
    assert frozenset({"retrieval"}) in kinds and frozenset({"logits"}) in kinds


def test_racer_single_source_variants():
    d, steps = synthetic_run("racer-retrieval", steps=20, capacity=32)
    assert d.wants_topk == 0
    assert all(set(t.sources[1:]) <= {"retrieval"} for t, _ in steps)
    d, steps = synthetic_run("racer-logits", steps=20, capacity=32, prime=True)
    assert d.wants_topk == K
    assert all(set(t.sources[1:]) <= {"logits"} and len(t) == 32 for t, _ in steps)


def test_drafters_never_share_state():
    a = make_drafter("racer", vocab_size=100)
    b = make_drafter("racer", vocab_size=100)
    assert a.automaton is not b.automaton and a.store is not b.store
    ctx = [1, 2, 3, 4, 5, 1, 2]
    a.start(ctx, 0, np.tile(np.arange(8), (len(ctx), 1)))
    assert len(b.automaton) == 0 and len(b.store) == 0
    assert len(b.propose([], 3, 16)) == 1
    assert len(a.propose(ctx, 3, 16)) == 16
    a.reset()
    assert len(a.automaton) == 0 and len(a.store) == 0 and len(a.propose([], 3, 16)) == 1


def test_deterministic():
    def strip(steps):
        out = []
        for t, r in steps:
            info = {k: v for k, v in t.info.items() if k != "draft_breakdown"}
            out.append((t.to_dict(), info, r))
        return out
    assert strip(synthetic_run("racer", steps=20)[1]) == strip(synthetic_run("racer", steps=20)[1])
    assert strip(synthetic_run("tr", steps=20)[1]) == strip(synthetic_run("tr", steps=20)[1])


def test_detail_pictures():
    d = make_drafter("racer", vocab_size=100)
    d.detail = True
    ctx = [1, 2, 3, 4, 5, 1, 2]
    d.start(ctx, 0, None)
    d.store.write([3, 90], np.array([[4, 90, 91, 92, 93, 94, 95, 96], [7] * 8]))
    tree = d.propose(ctx, 3, 24)
    rows = tree.info["copy_rows"]
    assert rows[0] == {"token": 3, "row": [4, 90, 91, 92, 93, 94, 95, 96]} and len(rows) <= 12
    snap = tree.info["automaton"]
    assert any("selected" in n["flags"] for n in snap["nodes"])
    json.dumps(tree.info)


def test_start_catches_up_on_unobserved_tokens():
    d = make_drafter("racer-retrieval")
    d.start([1, 2, 3], 0, None)
    # A second turn whose context contains a token committed without a verify step (9).
    d.start([1, 2, 3, 9, 1, 2, 3], 4, None)
    assert d.automaton.context_tail == [1, 2, 3, 9, 1, 2, 3]


# ---------------------------------------------------------------------------- registry

def test_registry():
    for m in ("ar", "pld", "tr", "racer", "racer-half", "racer-hard", "racer-retrieval", "racer-logits"):
        assert m in METHODS and make_drafter(m, vocab_size=10).name == m
    with pytest.raises(ValueError, match="known: .*racer"):
        make_drafter("nope")
    with pytest.raises(ValueError):
        make_drafter("racer-half", merge="hard")
    assert make_drafter("racer", breadth_rule="released").breadth_rule == "released"


def test_racer_lookup_chain_goes_past_the_automaton_window():
    # A 30-token passage seen once, then repeated: the automaton (window 10) can propose at most
    # the rest of its window below the match; the prompt-lookup chain continues the passage.
    passage = list(range(10, 40))
    ctx = [1, 2, 3] + passage + [4, 5] + passage[:5]
    root = passage[5]
    trees = {}
    for method in ("racer", "racer-nochain"):
        d = make_drafter(method, vocab_size=100)
        d.start(ctx, 0, None)
        trees[method] = d.propose(ctx, root, 64)
        trees[method].validate()
        assert len(trees[method]) <= 64
    with_chain, without = trees["racer"], trees["racer-nochain"]
    want = passage[6:6 + 16]
    node, depth = 0, 0
    for tok in want:  # the whole chain is a path of the tree
        node = with_chain.child(node, tok)
        assert node >= 0 and with_chain.meta[node].get("lookup") == 1
        depth += 1
    assert depth == 16 == with_chain.info["chain_len"]
    assert max(without.depths) < 16 and "lookup" not in without.sources
    assert without.info.get("chain_len", 0) == 0


def test_racer_lookup_chain_respects_capacity():
    passage = list(range(10, 40))
    ctx = passage + [1] + passage[:3]
    d = make_drafter("racer", vocab_size=100)
    d.start(ctx, 0, None)
    for cap in (1, 2, 3, 5, 8):
        tree = d.propose(ctx, passage[3], cap)
        tree.validate()
        assert len(tree) <= cap and tree.info["chain_len"] <= cap - 1


def test_periodic_lookup_continues_a_chain_that_runs_into_the_present():
    context = [9, 1, 2, 3, 1, 2, 3, 1, 2]
    plain = PLDDrafter(max_draft=10).propose(context, 3, 16)
    assert plain.tokens[1:] == [1, 2, 3]            # stops where the match's continuation ends
    d = PLDDrafter(max_draft=10, periodic=True)
    tree = d.propose(context, 3, 16)
    assert tree.tokens[1:] == [1, 2, 3, 1, 2, 3, 1, 2, 3, 1]
    assert tree.is_chain()
    assert d.propose(context, 3, 5).tokens[1:] == [1, 2, 3, 1]   # capacity still bounds it
    # A match with room after it is copied as before, not repeated.
    far = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 4, 5]
    assert PLDDrafter(max_draft=10, periodic=True).propose(far, 6, 16).tokens[1:] == far[2:12]


def test_lookup_by_run_copies_the_occurrence_that_agrees_furthest_back():
    from racer.drafters.pld import RUN_CANDIDATES, match_run
    # "1 2 3 4" then the root 5: an older occurrence agrees for 5 tokens and goes on with 6 7;
    # the latest agrees for the 3-gram "3 4 5" alone and goes on with 8 9.
    ctx = [1, 2, 3, 4, 5, 6, 7, 0, 3, 4, 5, 8, 9, 0, 1, 2, 3, 4]
    recent = PLDDrafter(max_draft=4).propose(ctx, 5, 16)
    assert recent.tokens[1:] == [8, 9, 0, 1] and recent.info["match_run"] == 3
    d = PLDDrafter(max_draft=4, pick="run")
    tree = d.propose(ctx, 5, 16)
    assert tree.tokens[1:] == [6, 7, 0, 3] and tree.info["match_len"] == 3
    assert tree.info["match_run"] == match_run(ctx, 4, 5) == 5
    # A tie keeps the latest occurrence, as prompt lookup does.
    tie = [7, 3, 4, 5, 6, 7, 3, 4, 5, 8, 9, 3, 4]
    assert PLDDrafter(max_draft=2, pick="run").propose(tie, 5, 16).tokens[1:] == [8, 9]
    # Only the latest RUN_CANDIDATES occurrences are compared: one older than those is not found.
    far = [1, 2, 3, 4, 5, 6] + [0, 3, 4, 5, 8] * RUN_CANDIDATES + [1, 2, 3, 4]
    assert PLDDrafter(max_draft=1, pick="run").propose(far, 5, 16).tokens[1:] == [8]
    # Fed a token at a time (as decoding indexes its context), it finds the same occurrence.
    d = PLDDrafter(max_draft=4, pick="run")
    for n in range(1, len(ctx)):
        d.propose(ctx[:n], ctx[n], 16)
    assert d.propose(ctx, 5, 16).tokens[1:] == [6, 7, 0, 3]
    with pytest.raises(ValueError, match="pick"):
        PLDDrafter(pick="longest")


def test_a_chain_behind_a_long_agreement_runs_to_long_draft():
    passage = list(range(10, 70))
    ctx = passage + [1] + passage[:20]              # the root passage[20] closes 21 agreeing tokens
    d = PLDDrafter(max_draft=8, long_draft=24, long_run=16)
    chain, n, run = d.chain(ctx, passage[20], 100)
    assert (chain, n, run) == (passage[21:45], 3, 21)
    assert d.chain(ctx, passage[20], 10)[0] == passage[21:31]    # room still bounds it
    short = passage + [1] + passage[10:20]          # agrees 11 tokens back: below long_run
    assert d.chain(short, passage[20], 100)[0] == passage[21:29]
    assert PLDDrafter(max_draft=8).chain(ctx, passage[20], 100)[0] == passage[21:29]
    assert d.chain([2, 3], 4, 100) == ([], 0, 0)


def test_racer_chain_copies_by_run_unless_asked_for_the_latest():
    ctx = [1, 2, 3, 4, 5, 6, 7, 0, 3, 4, 5, 8, 9, 0, 1, 2, 3, 4]
    chains = {}
    for pick in ("run", "recent"):
        d = make_drafter("racer", vocab_size=16, chain_pick=pick)
        d.start(ctx, 0, None)
        tree = d.propose(ctx, 5, 12)
        chains[pick] = [tree.tokens[i] for i in range(1, len(tree)) if tree.meta[i].get("lookup")][:2]
    assert chains == {"run": [6, 7], "recent": [8, 9]}
    with pytest.raises(ValueError, match="chain_pick"):
        make_drafter("racer", vocab_size=16, chain_pick="latest", lookup_chain=False)


def test_store_keeps_row_probabilities_and_expansion_carries_them():
    s = CopyLogitStore(50, 4)
    s.write([1, 2], np.array([[2, 3, -1, -1], [4, 5, 6, -1]]),
            np.array([[0.7, 0.2, 0.05, 0.0], [0.5, 0.3, 0.1, 0.05]], dtype=np.float32))
    assert s.row(1) == [2, 3] and s.row_p(1) == pytest.approx([0.7, 0.2])  # no probability for empty entries
    assert s.row_p(2) == pytest.approx([0.5, 0.3, 0.1])
    exp = s.expand(1, 10)
    assert exp.tokens == [2, 3, 4, 5, 6][:len(exp.tokens)]
    assert exp.probs[:2] == pytest.approx([0.7, 0.2]) and exp.probs[2] == pytest.approx(0.5)
    # A writer without probabilities (Token Recycling, racer-ranks) leaves them unknown (-1),
    # and a rewrite replaces the cached list.
    s.write([1], np.array([[9, -1, -1, -1]]))
    assert s.row(1) == [9] and s.row_p(1) == [-1.0]
    with pytest.raises(ValueError, match="shape"):
        s.write([1], np.array([[9, 8, 7, 6]]), np.array([[0.5]]))
    s.reset()
    assert s.row_p(2) == [] and (s.probs == -1).all()


def test_racer_logits_nodes_carry_their_row_probability():
    d = make_drafter("racer", vocab_size=100)
    d.start([1, 2, 3], 0, np.tile(np.array([[7, 8, -1, -1, -1, -1, -1, -1]]), (3, 1)),
            np.tile(np.array([[0.9, 0.05, 0, 0, 0, 0, 0, 0]], dtype=np.float32), (3, 1)))
    tree = d.propose([1, 2, 3], 3, 40)  # room for the lookup chain and the logits tree
    probs = {tree.tokens[i]: tree.meta[i].get("p_row") for i in range(1, len(tree)) if tree.depths[i] == 1}
    assert probs[7] == pytest.approx(0.9) and probs[8] == pytest.approx(0.05)
    assert d.wants_topk_p and not make_drafter("racer-ranks", vocab_size=100).wants_topk_p
    assert not make_drafter("tr", vocab_size=100).wants_topk_p
