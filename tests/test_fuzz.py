"""Property / fuzz tests (hypothesis) of the automaton and the draft tree with random token
streams and random interleavings of every public operation. No exception; invariants hold."""
from __future__ import annotations

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from racer.automaton import Automaton
from racer.tree import SOURCES, DraftTree

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

tokens = st.integers(min_value=0, max_value=11)          # a small alphabet: lots of repeats and borders
op = st.one_of(
    st.tuples(st.just("feed"), st.lists(tokens, min_size=0, max_size=12)),
    st.tuples(st.just("borders"), tokens),
    st.tuples(st.just("cont"), tokens, st.integers(min_value=0, max_value=40)),
    st.tuples(st.just("snap"), st.one_of(st.none(), tokens), st.integers(min_value=-3, max_value=30)),
    st.tuples(st.just("find"), st.lists(tokens, max_size=12)),
    st.tuples(st.just("reset"),),
)


@FAST
@given(window=st.integers(2, 6), extra=st.integers(1, 40), ops=st.lists(op, min_size=1, max_size=40))
def test_automaton_random_interleavings_keep_invariants(window, extra, ops):
    a = Automaton(capacity=window + extra, window=window)
    ctx: list[int] = []
    for o in ops:
        kind = o[0]
        if kind == "feed":
            a.feed(o[1])
            ctx += o[1]
        elif kind == "borders":
            bs = a.borders(o[1])
            tail = (ctx[-(window - 1):] if window > 1 else []) + [o[1]]
            for v in bs:
                s = a.node_string(v)
                assert 2 <= len(s) <= window and tail[-len(s):] == s       # each border is a suffix
            assert [a._dep[v] for v in bs] == sorted((a._dep[v] for v in bs), reverse=True)
        elif kind == "cont":
            c = a.continuations(o[1], o[2])
            assert len(c) <= max(0, o[2])
            for i, p in enumerate(c.parents):
                assert -1 <= p < i                                          # topological, closed under parents
        elif kind == "snap":
            snap = a.snapshot(o[1], max_nodes=o[2])
            ids = {n["id"] for n in snap["nodes"]}
            assert 0 in ids and len(ids) == len(snap["nodes"]) <= max(1, o[2], 1)
            assert all(n["parent"] in ids or n["id"] == 0 for n in snap["nodes"])
            assert snap["size"] == len(a) <= a.capacity
        elif kind == "find":
            v = a.find(o[1])
            assert v == -1 or a.node_string(v) == list(o[1])
        else:
            a.reset()
            ctx = []
        assert len(a) <= a.capacity
        a.check_invariants()


@FAST
@given(seed=st.integers(0, 2**32 - 1), window=st.integers(2, 10), cap_extra=st.integers(1, 60),
       alphabet=st.integers(2, 200), n=st.integers(1, 400))
def test_automaton_long_random_streams_at_capacity(seed, window, cap_extra, alphabet, n):
    rng = np.random.default_rng(seed)
    a = Automaton(capacity=window + cap_extra, window=window)
    stream = rng.integers(0, alphabet, size=n).tolist()
    i = 0
    while i < len(stream):
        k = int(rng.integers(1, 6))
        a.feed(stream[i:i + k])
        i += k
        a.continuations(int(rng.integers(0, alphabet)), int(rng.integers(1, 20)))
        assert len(a) <= a.capacity
    a.check_invariants()
    a.snapshot(int(rng.integers(0, alphabet)))


def _random_tree(data, max_nodes=40) -> DraftTree:
    t = DraftTree.root_only(data.draw(st.integers(0, 50)))
    for _ in range(data.draw(st.integers(0, max_nodes))):
        kind = data.draw(st.sampled_from(["add", "path"]))
        parent = data.draw(st.integers(0, len(t) - 1))
        src = data.draw(st.sampled_from(["retrieval", "logits", "template", "lookup"]))
        if kind == "add":
            t.add(parent, data.draw(st.integers(0, 6)), src, rank=data.draw(st.integers(0, 8)))
        else:
            t.add_path(data.draw(st.lists(st.integers(0, 6), max_size=5)), src, parent=parent)
    return t


@FAST
@given(st.data())
def test_tree_random_add_and_merge(data):
    t = _random_tree(data)
    t.validate()
    # merging sources: a node proposed by retrieval and by logits reads "both"
    for i in range(1, len(t)):
        assert t.sources[i] in SOURCES and t.child(t.parents[i], t.tokens[i]) == i
    # the mask: row i attends to the whole prefix and exactly to i's ancestors (and itself)
    past = data.draw(st.integers(0, 7))
    mask = t.attention_mask(past, torch.float32, "cpu")[0, 0]
    assert mask.shape == (len(t), past + len(t))
    assert bool((mask[:, :past] == 0).all())
    for i in range(len(t)):
        want = set(t.path_to(i))
        got = {j for j in range(len(t)) if mask[i, past + j] == 0}
        assert got == want
    pos = t.position_ids(past, "cpu")[0].tolist()
    assert pos == [past + len(t.path_to(i)) - 1 for i in range(len(t))]
    # a dict round trip keeps everything, including child lookups
    u = DraftTree.from_dict(t.to_dict())
    u.validate()
    assert u.to_dict() == t.to_dict() and all(u.child(p, x) == i for i, (p, x) in
                                              enumerate(zip(t.parents, t.tokens)) if p >= 0)


@FAST
@given(st.data())
def test_tree_both_source_marking(data):
    t = DraftTree.root_only(0)
    toks = data.draw(st.lists(st.integers(0, 4), min_size=1, max_size=6))
    a = t.add_path(toks, "retrieval")
    b = t.add_path(toks, "logits")
    assert a == b and all(t.sources[i] == "both" for i in a)
    t.validate()
