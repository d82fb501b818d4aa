"""The retrieval automaton against brute force, with constant eviction on tiny alphabets."""
from __future__ import annotations

import random

import pytest
from hypothesis import given, settings, strategies as st

from racer.automaton import Automaton, Continuations


class Spy(Automaton):
    """Checks every eviction at the moment it happens: a leaf, not the root, not the parent
    of the node being created, and the least recently touched of the evictable leaves."""

    def _new_node(self, parent: int, token: int) -> int:
        self._creating_under = parent
        return super()._new_node(parent, token)

    def _pop_lru_leaf(self) -> int:
        leaves = [v for v in range(1, self._size + 1) if not self._kids[v]]
        evictable = [v for v in leaves if v != self._creating_under]
        oldest = min(self._touch[v] for v in evictable)
        v = super()._pop_lru_leaf()
        assert v != 0 and not self._kids[v], "evicted a node with children"
        assert v != self._creating_under, "evicted the parent of the node being inserted"
        assert self._touch[v] == oldest, "not the least recently touched leaf"
        return v


# ------------------------------------------------------------------ brute force
def trie_strings(a: Automaton) -> dict[tuple[int, ...], int]:
    out = {(): 0}
    for v in range(1, len(a) + 1):
        s = tuple(a.node_string(v))
        assert s not in out, f"duplicate string {s}"
        out[s] = v
    return out


def brute_fail(strings: dict, s: tuple) -> int:
    for i in range(1, len(s)):
        if s[i:] in strings:
            return strings[s[i:]]
    return 0


def brute_state(strings: dict, ctx: list[int], window: int) -> int:
    for L in range(min(window, len(ctx)), 0, -1):
        if tuple(ctx[-L:]) in strings:
            return strings[tuple(ctx[-L:])]
    return 0


def brute_borders(strings: dict, ctx: list[int], root: int, window: int) -> list[int]:
    seq = ctx + [root]
    return [strings[tuple(seq[-L:])] for L in range(min(window, len(seq)), 1, -1)
            if tuple(seq[-L:]) in strings]


def windows(ctx: list[int], window: int) -> list[tuple[int, ...]]:
    return [tuple(ctx[max(0, j - window + 1): j + 1]) for j in range(len(ctx))]


def brute_freq(ctx: list[int], window: int, s: tuple) -> int:
    return sum(1 for w in windows(ctx, window) if w[:len(s)] == s)


def brute_candidates(a: Automaton, strings: dict, borders: list[int]) -> dict[tuple, tuple]:
    """relative path -> (score, border depth) over all borders' subtrees."""
    out: dict[tuple, tuple] = {}
    for s, v in strings.items():
        for b in borders:
            bs = tuple(a.node_string(b))
            if len(s) > len(bs) and s[:len(bs)] == bs:
                rel = s[len(bs):]
                score, bdep = out.get(rel, (0, 0))
                out[rel] = (max(score, a._freq[v]), max(bdep, len(bs)))
    return out


def check_continuations(a: Automaton, c: Continuations, strings: dict, cap: int) -> None:
    n = len(c)
    assert n <= max(cap, 0)
    for lst in (c.parents, c.freqs, c.border_depths, c.ranks, c.node_ids):
        assert len(lst) == n
    assert c.match_depth == (a._dep[c.borders[0]] if c.borders else 0)
    seen, paths, nkids = set(), [], {}
    for i in range(n):
        p = c.parents[i]
        assert -1 <= p < i, "not topological / not ancestor-closed"
        assert (p, c.tokens[i]) not in seen, "duplicate siblings"
        seen.add((p, c.tokens[i]))
        assert c.ranks[i] == nkids.get(p, 0)
        nkids[p] = c.ranks[i] + 1
        paths.append((paths[p] if p >= 0 else ()) + (c.tokens[i],))
        if p >= 0:
            assert c.freqs[i] <= c.freqs[p]
    # The selection is the exact top set by (score, border depth, shallower, token id).
    cands = brute_candidates(a, strings, c.borders)
    for path, f, bd in zip(paths, c.freqs, c.border_depths):
        assert cands[path] == (f, bd)
    key = lambda path: (-cands[path][0], -cands[path][1], len(path), path[-1])
    want = sorted(key(p) for p in cands)[:cap]
    assert sorted(key(p) for p in paths) == want


def check_all(a: Automaton, ctx: list[int], root: int, cap: int, evicted_ever: bool) -> None:
    a.check_invariants()
    strings = trie_strings(a)
    assert len(a) == len(strings) - 1 <= a.capacity
    for s, v in strings.items():
        assert a.fail(v) == brute_fail(strings, s)
        assert len(s) <= a.window
        # Counts start when a node is (re)created, so eviction can only lower them.
        want = brute_freq(ctx, a.window, s) if s else len(ctx)
        assert a._freq[v] == want if not evicted_ever else a._freq[v] <= want
    assert a.state == brute_state(strings, ctx, a.window)
    state_before = a.state
    bs = a.borders(root)
    assert bs == brute_borders(strings, ctx, root, a.window)
    assert all(a._touch[b] == a.step for b in bs)
    assert a.state == state_before
    c = a.continuations(root, cap)
    assert c.borders == bs
    check_continuations(a, c, strings, cap)


def check_evictions(before: set[tuple], evictions: list[dict]) -> None:
    """Seen from outside: a node that existed before feed() and extends an evicted string
    must itself have been evicted earlier in the call, or the evicted node had children."""
    gone: list[tuple] = []
    for e in evictions:
        s = tuple(e["string"])
        assert len(s) == e["depth"] >= 1 and s[-1] == e["token"]
        for x in before:
            if len(x) > len(s) and x[:len(s)] == s:
                assert x in gone, f"{s} evicted while {x} hung below it"
        gone.append(s)


def run_stream(capacity: int, window: int, chunks: list[list[int]], roots: list[int], cap: int) -> None:
    a = Spy(capacity, window)
    ctx: list[int] = []
    evicted_ever = False
    touched: dict[tuple, int] = {}  # string -> the step it was last touched, by the spec
    for chunk, root in zip(chunks, roots):
        before = set(trie_strings(a))
        a.feed(chunk)
        for t in chunk:
            touched[tuple(ctx[-window:])] = a.step  # the old match state (failure climb)
            ctx.append(t)
            w = ctx[-window:]
            for k in range(1, len(w) + 1):  # the insert path
                touched[tuple(w[:k])] = a.step
        check_evictions(before, a.last_evictions)
        evicted_ever |= bool(a.last_evictions)
        check_all(a, ctx, root, cap, evicted_ever)
        for b in a.borders(root):
            touched[tuple(a.node_string(b))] = a.step
        for s, v in trie_strings(a).items():
            if s:
                assert a._touch[v] == touched[s], f"last_touch of {s}"


# ------------------------------------------------------------------------ tests
def test_constructor_validates() -> None:
    with pytest.raises(ValueError):
        Automaton(capacity=10, window=10)
    with pytest.raises(ValueError):
        Automaton(capacity=100, window=1)
    a = Automaton()
    assert (a.capacity, a.window, len(a), a.state, a.step) == (10_000, 10, 0, 0, 0)
    assert a.borders(5) == [] and len(a.continuations(5, 64)) == 0


@settings(max_examples=120, deadline=None)
@given(
    window=st.integers(2, 5),
    extra=st.integers(1, 35),
    alphabet=st.integers(2, 5),
    cap=st.integers(0, 12),
    data=st.data(),
)
def test_property_against_brute_force(window: int, extra: int, alphabet: int, cap: int, data) -> None:
    sym = st.integers(0, alphabet - 1)
    chunks = data.draw(st.lists(st.lists(sym, min_size=0, max_size=6), min_size=1, max_size=25))
    roots = data.draw(st.lists(sym, min_size=len(chunks), max_size=len(chunks)))
    run_stream(window + extra, window, chunks, roots, cap)


@pytest.mark.parametrize("seed", range(6))
def test_seeded_streams_with_constant_eviction(seed: int) -> None:
    rng = random.Random(seed)
    window = rng.randint(3, 5)
    capacity = rng.randint(12, 40)
    alphabet = rng.randint(2, 5)
    chunks, roots = [], []
    for _ in range(120):
        if chunks and rng.random() < 0.3:  # repetition, as in real text
            chunks.append(list(rng.choice(chunks)))
        else:
            chunks.append([rng.randrange(alphabet) for _ in range(rng.randint(1, 4))])
        roots.append(rng.randrange(alphabet))
    run_stream(capacity, window, chunks, roots, cap=rng.randint(4, 16))


def test_freq_counts_windows_without_eviction() -> None:
    rng = random.Random(7)
    a = Automaton(capacity=5000, window=4)
    ctx = [rng.randrange(3) for _ in range(200)]
    a.feed(ctx[:50])
    for i in range(50, 200, 3):
        a.feed(ctx[i:i + 3])
    assert not a.last_evictions
    for s, v in trie_strings(a).items():
        if s:
            assert a._freq[v] == brute_freq(ctx, 4, s)


def test_new_window_fixes_old_fail_link() -> None:
    a, A, B, C, X = Automaton(capacity=50, window=3), 1, 2, 3, 9
    a.feed([A, B, C])  # windows: a, a b, a b c
    abc = a.find([A, B, C])
    assert abc > 0 and a.fail(abc) == 0 and a.find([B, C]) == -1
    a.feed([X, B, C])  # windows: b c x, c x b, x b c -> "b c" now exists
    bc = a.find([B, C])
    assert bc > 0 and a.fail(abc) == bc
    assert a.fail(a.find([X, B, C])) == bc


def test_eviction_redirects_fail_links() -> None:
    # window 2, capacity 3: "1", "1 2" then "2", "2 3" need a fourth node.
    a = Automaton(capacity=3, window=2)
    a.feed([1, 2])
    a.feed([5])  # old state "1 2" is touched at step 2; insert "2 5"
    assert [e["string"] for e in a.last_evictions] == [[1, 2]]
    assert a.find([1, 2]) == -1 and a.find([2, 5]) > 0 and len(a) == 3
    a.check_invariants()


def test_borders_and_continuations_on_a_copy() -> None:
    a = Automaton(capacity=1000, window=5)
    text = [1, 2, 3, 4, 5, 6, 7, 8]
    a.feed(text + [20, 21] + [1, 2])
    # Root 3 continues "1 2" -> borders "1 2 3" (and nothing shorter but "2 3").
    bs = a.borders(3)
    assert [a.node_string(b) for b in bs] == [[1, 2, 3], [2, 3]]
    c = a.continuations(3, 64)
    assert c.match_depth == 3 and c.tokens[:2] == [4, 5]
    assert c.parents[:2] == [-1, 0]
    # Same input, same output.
    b = Automaton(capacity=1000, window=5)
    b.feed(text + [20, 21] + [1, 2])
    assert b.continuations(3, 64) == c


def test_snapshot_schema() -> None:
    rng = random.Random(3)
    a = Automaton(capacity=300, window=5)
    a.feed([rng.randrange(4) for _ in range(400)])
    c = a.continuations(2, 16)
    snap = a.snapshot(root_token=2, selected=c.trie_nodes(), recent=8, max_nodes=40)
    assert set(snap) == {"nodes", "state", "borders", "evicted", "size", "capacity", "step", "window"}
    assert (snap["size"], snap["capacity"], snap["step"], snap["window"]) == (len(a), 300, a.step, 5)
    assert snap["borders"] == a.borders(2)
    nodes = {n["id"]: n for n in snap["nodes"]}
    assert 20 <= len(nodes) <= 40 and 0 in nodes and snap["state"] in nodes
    keys = {"id", "token", "depth", "freq", "parent", "fail", "age", "last_touch", "flags"}
    for n in snap["nodes"]:
        assert set(n) == keys
        assert all(isinstance(n[k], int) for k in keys - {"flags"})
        assert set(n["flags"]) <= {"root", "state", "border", "selected", "recent"}
        assert n["parent"] == -1 if n["id"] == 0 else n["parent"] in nodes  # ancestor-closed
        assert n["fail"] == (-1 if n["id"] == 0 else a.fail(n["id"]))
        assert n["age"] == snap["step"] - n["last_touch"] >= 0
    assert "root" in nodes[0]["flags"] and "state" in nodes[snap["state"]]["flags"]
    assert all("border" in nodes[b]["flags"] for b in snap["borders"])
    assert any("recent" in n["flags"] for n in snap["nodes"])
    for e in snap["evicted"]:
        assert set(e) == {"id", "token", "depth", "string"}
    # Small tries are shown whole; max_nodes is a hard cap.
    small = Automaton(capacity=50, window=3)
    small.feed([1, 2])
    assert len(small.snapshot()["nodes"]) == 3
    assert len(a.snapshot(2, max_nodes=5)["nodes"]) <= 5


def test_long_stream_stays_at_capacity() -> None:
    rng = random.Random(11)
    a = Automaton(capacity=1000, window=10)
    history: list[int] = []
    fed = 0
    while fed < 100_000:
        if history and rng.random() < 0.5:
            s = rng.randrange(len(history))
            chunk = history[s:s + rng.randint(2, 20)]
        else:
            chunk = [rng.randrange(50) for _ in range(rng.randint(1, 8))]
        a.feed(chunk)
        history = (history + chunk)[-2000:]
        fed += len(chunk)
        if fed > 5000:
            assert len(a) == a.capacity
    a.check_invariants()
    # Memory stays flat: arrays sized by capacity, the clock heap bounded by the buckets.
    assert len(a._tok) == a.capacity + 1
    assert len(a._clocks) <= 2 * len(a._buckets) + 64
    assert len(a.continuations(history[-1], 64)) <= 64


def test_reset_forgets() -> None:
    a = Automaton(capacity=20, window=3)
    a.feed([1, 2, 3, 1, 2])
    a.reset()
    assert len(a) == 0 and a.state == 0 and a.step == 0 and a.borders(3) == []
    a.check_invariants()
