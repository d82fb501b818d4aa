"""RACER's retrieval side: an Aho–Corasick automaton over the n-grams of the context.

Every length-`window` n-gram of the context (shorter ones at its very start) is inserted
into a trie of at most `capacity` nodes (the root not counted). Each node counts `freq`, the
number of inserted windows that passed through it. Given the token `x0` that the model has
just fixed, the *borders* are the trie nodes of depth >= 2 whose string is a suffix of
context + [x0]; what grew below them earlier is what followed those suffixes before, and
`continuations()` pools those subtrees into draft candidates.

Failure links: computed at use, exactly.
    fail(v) = the longest proper suffix of v's string that is a trie path. Nothing here
    stores it. Keeping links incrementally would mean, on every insert, finding every node
    whose string ends with the new string (links pointing past it must move) and, on every
    eviction, every node whose link pointed at the victim: both need reverse indexes that
    cost more per step than the uses do. The hot path never needs a stored link:
    * the match state after feeding is, exactly, the node of the window just inserted
      (that window is a suffix of the context of the greatest possible length, `window`,
      and it is in the trie because we just put it there). The goto/failure walk that an
      AC automaton would run reaches the same node: from the old state s, either s is the
      new node's parent (s shorter than `window`), or fail(s) is (the window minus its last
      token, the longest proper suffix of s, is on the path just inserted). So the advance
      is O(1), and its touches (s, fail(s), the new state) are all made.
    * the borders are the suffixes of context + [x0] of length 2..window that are trie
      paths: <= window - 1 direct walks from the root, at most ~window^2/2 dict lookups
      (54 for window 10), measured at a few microseconds, and correct whatever was
      inserted or evicted in between.
    * fail(v) itself (for pictures and tests) tries the suffixes of v's string from the
      longest: O(depth^2) lookups, only for the few nodes a picture shows.

LRU eviction (leaves only): the clock is the number of feed() calls. A node's
`last_touch` is set when it is on an insert path, is the match state (and so on the failure
climb), or is returned as a border. Leaves sit in buckets keyed by their last touch, with a
min-heap of bucket clocks (stale clocks are skipped lazily, and the heap is rebuilt when it
holds many more clocks than buckets, so memory stays flat). When a node is needed at
capacity the oldest bucket gives up a leaf: never the root, never a node with children
(they are not in any bucket), never the parent of the node being created (taken out of
its bucket before the victim is chosen; the rest of the insert path has children). Among
leaves of the same age the choice is arbitrary but deterministic (a set of small ints).
Node ids are 1..len(self) and the id of a victim is reused at once.
"""
from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Continuations:
    """Draft candidates from the borders' subtrees, parallel lists in topological order."""

    tokens: list[int] = field(default_factory=list)
    #: -1 = attached to the draft root (x0), else an index into these lists.
    parents: list[int] = field(default_factory=list)
    #: Merged score: max freq over the trie nodes (one per border) with this relative path.
    freqs: list[int] = field(default_factory=list)
    #: Depth of the deepest border that proposed the candidate.
    border_depths: list[int] = field(default_factory=list)
    #: Rank among its siblings in selection order (0 = selected first = best).
    ranks: list[int] = field(default_factory=list)
    #: Trie node ids merged into each candidate (for pictures).
    node_ids: list[list[int]] = field(default_factory=list)
    #: Border node ids used, deepest first.
    borders: list[int] = field(default_factory=list)
    #: Depth of the deepest border (0 if none).
    match_depth: int = 0

    def __len__(self) -> int:
        return len(self.tokens)

    def trie_nodes(self) -> set[int]:
        """Every trie node id behind a candidate (a `selected` set for snapshot())."""
        return {v for ids in self.node_ids for v in ids}


class Automaton:
    """Trie of context n-grams with exact failure links, LRU leaf eviction and drafting."""

    def __init__(self, capacity: int = 10_000, window: int = 10) -> None:
        if window < 2:
            raise ValueError(f"window must be >= 2, got {window}")
        if capacity < window + 1:
            raise ValueError(f"capacity must be >= window + 1 = {window + 1}, got {capacity}")
        self.capacity = int(capacity)
        self.window = int(window)
        self.reset()

    # ------------------------------------------------------------------ state
    def reset(self) -> None:
        """Forget everything (a new session)."""
        # Parallel per-node arrays; index 0 is the root. Ids 1..size are all live.
        self._tok: list[int] = [-1]
        self._par: list[int] = [-1]
        self._dep: list[int] = [0]
        self._freq: list[int] = [0]
        self._touch: list[int] = [0]
        self._kids: list[dict[int, int]] = [{}]
        # Clock of the leaf bucket holding the node, -1 when it is not a leaf (or the root).
        self._inb: list[int] = [-1]
        self._buckets: dict[int, set[int]] = {}
        self._clocks: list[int] = []  # min-heap of bucket clocks, may hold stale ones
        self._size = 0
        self._step = 0
        self._ctx: list[int] = []  # the last `window` tokens of the context
        self._state = 0
        # Ids in order of their latest touch (stale duplicates filtered by readers).
        self._recent: deque[int] = deque(maxlen=512)
        self.last_evictions: list[dict[str, Any]] = []

    def __len__(self) -> int:
        return self._size

    @property
    def state(self) -> int:
        """The match state: the deepest node whose string is a suffix of the context."""
        return self._state

    @property
    def step(self) -> int:
        """The LRU clock: how many times feed() was called since reset()."""
        return self._step

    @property
    def context_tail(self) -> list[int]:
        """The last `window` tokens fed (all the automaton remembers of the context)."""
        return list(self._ctx)

    # ------------------------------------------------------------- leaf buckets
    def _unleaf(self, v: int) -> None:
        c = self._inb[v]
        if c >= 0:
            b = self._buckets[c]
            b.discard(v)
            if not b:
                del self._buckets[c]
            self._inb[v] = -1

    def _enleaf(self, v: int) -> None:
        c = self._touch[v]
        b = self._buckets.get(c)
        if b is None:
            self._buckets[c] = {v}
            heapq.heappush(self._clocks, c)
            # Clocks of emptied buckets linger in the heap; rebuild before they pile up.
            if len(self._clocks) > 2 * len(self._buckets) + 64:
                self._clocks = list(self._buckets)
                heapq.heapify(self._clocks)
        else:
            b.add(v)
        self._inb[v] = c

    def _touch_node(self, v: int) -> None:
        now = self._step
        if self._touch[v] != now:
            self._touch[v] = now
            self._recent.append(v)
            if self._inb[v] >= 0:
                self._unleaf(v)
                self._enleaf(v)

    def _pop_lru_leaf(self) -> int:
        clocks, buckets = self._clocks, self._buckets
        while True:
            b = buckets.get(clocks[0])
            if b:
                v = b.pop()
                if not b:
                    del buckets[heapq.heappop(clocks)]
                self._inb[v] = -1
                return v
            heapq.heappop(clocks)

    # ---------------------------------------------------------------- insertion
    def _new_node(self, parent: int, token: int) -> int:
        # The parent is about to get a child: out of the buckets now, which also keeps it
        # from being chosen as the victim below.
        self._unleaf(parent)
        if self._size < self.capacity:
            self._size += 1
            v = self._size
            self._tok.append(token)
            self._par.append(parent)
            self._dep.append(self._dep[parent] + 1)
            self._freq.append(0)
            self._touch.append(self._step)
            self._kids.append({})
            self._inb.append(-1)
        else:
            v = self._evict(protect=parent)
            self._tok[v] = token
            self._par[v] = parent
            self._dep[v] = self._dep[parent] + 1
            self._freq[v] = 0
            self._touch[v] = self._step
        self._kids[parent][token] = v
        self._enleaf(v)
        self._recent.append(v)
        return v

    def _evict(self, protect: int) -> int:
        v = self._pop_lru_leaf()
        self.last_evictions.append(
            {"id": v, "token": self._tok[v], "depth": self._dep[v], "string": self.node_string(v)}
        )
        p = self._par[v]
        del self._kids[p][self._tok[v]]
        if p != 0 and p != protect and not self._kids[p]:
            self._enleaf(p)
        return v

    def feed(self, tokens: list[int]) -> None:
        """Append tokens to the context: insert the window ending at each, count and touch
        its path, and advance the match state. One LRU clock tick per call."""
        self._step += 1
        self.last_evictions = []
        kids, freq, touch, inb = self._kids, self._freq, self._touch, self._inb
        ctx, n = self._ctx, self.window
        for t in tokens:
            t = int(t)
            # The old state is the first node of the goto/failure climb (see module doc).
            self._touch_node(self._state)
            ctx.append(t)
            if len(ctx) > n:
                del ctx[0]
            v = 0
            freq[0] += 1
            now = self._step
            for x in ctx:
                c = kids[v].get(x)
                if c is None:
                    c = self._new_node(v, x)
                elif touch[c] != now:
                    touch[c] = now
                    self._recent.append(c)
                    if inb[c] >= 0:
                        self._unleaf(c)
                        self._enleaf(c)
                freq[c] += 1
                v = c
            self._state = v
        self._touch[0] = self._step

    # ------------------------------------------------------------------ queries
    def _walk(self, tokens: list[int]) -> int:
        """Node id of the path `tokens` from the root, or -1."""
        kids, v = self._kids, 0
        for t in tokens:
            v = kids[v].get(t, -1)
            if v < 0:
                return -1
        return v

    def child(self, node: int, token: int) -> int:
        """The goto edge: `node`'s child carrying `token`, or -1."""
        return self._kids[node].get(int(token), -1)

    def children(self, node: int) -> dict[int, int]:
        """token -> child node id (a copy)."""
        return dict(self._kids[node])

    def depth(self, node: int) -> int:
        return self._dep[node]

    def freq(self, node: int) -> int:
        """How many inserted windows passed through `node`."""
        return self._freq[node]

    def last_touch(self, node: int) -> int:
        """The LRU clock (`step`) when `node` was last touched."""
        return self._touch[node]

    def parent(self, node: int) -> int:
        return self._par[node]

    def peek_borders(self, root_token: int) -> list[int]:
        """`borders(root_token)` without touching anything (for pictures)."""
        return self._borders(root_token)

    def find(self, tokens: list[int]) -> int:
        """Node id whose string is `tokens` (0 for []), or -1 when it is not in the trie."""
        return self._walk([int(t) for t in tokens])

    def _borders(self, root_token: int) -> list[int]:
        seq = self._ctx[-(self.window - 1):] + [int(root_token)]
        kids, out = self._kids, []
        for i in range(len(seq) - 1):  # suffix seq[i:], longest first, length >= 2
            v = 0
            for t in seq[i:]:
                v = kids[v].get(t, -1)
                if v < 0:
                    break
            else:
                out.append(v)
        return out

    def borders(self, root_token: int) -> list[int]:
        """Nodes of depth >= 2 whose string is a suffix of context + [root_token], deepest
        first. Touches them. The match state is left alone (root_token is fed later)."""
        out = self._borders(root_token)
        for v in out:
            self._touch_node(v)
        return out

    def continuations(self, root_token: int, capacity: int) -> Continuations:
        """Pool the subtrees below all borders into at most `capacity` draft candidates.

        Candidates are relative token paths below the draft root; the same path under
        several borders is one candidate whose score is the max freq of its trie nodes.
        Selection is best-first with a heap ordered by, in turn:
          1. higher score;
          2. deeper border (the deepest border proposing it: the longer match is likelier);
          3. shallower candidate;
          4. smaller token id;
          5. parent selected earlier (makes the order total, hence deterministic).
        A child never scores above its parent (every window through a child went through
        the parent), so the selection is the global top set and closed under ancestors.
        """
        bs = self.borders(root_token)
        out = Continuations(borders=bs, match_depth=self._dep[bs[0]] if bs else 0)
        if not bs or capacity <= 0:
            return out
        kids, freq, dep = self._kids, self._freq, self._dep
        heap: list[tuple] = []
        heappush = heapq.heappush

        def push(nodes: list[int], parent: int, rel: int) -> None:
            if len(nodes) == 1:  # the common case: one border proposes this path
                for t, c in kids[nodes[0]].items():
                    heappush(heap, (-freq[c], rel - dep[c], rel, t, parent, [c]))
                return
            # Group the children of `nodes` by token: one candidate per relative path.
            groups: dict[int, list[int]] = {}
            for u in nodes:
                for t, c in kids[u].items():
                    g = groups.get(t)
                    if g is None:
                        groups[t] = [c]
                    else:
                        g.append(c)
            for t, g in groups.items():
                if len(g) == 1:
                    c = g[0]
                    heappush(heap, (-freq[c], rel - dep[c], rel, t, parent, g))
                else:
                    score = max([freq[c] for c in g])
                    bdep = max([dep[c] for c in g]) - rel
                    heappush(heap, (-score, -bdep, rel, t, parent, g))

        push(bs, -1, 1)
        nkids: dict[int, int] = {}
        while heap and len(out.tokens) < capacity:
            negs, negb, rel, t, parent, g = heapq.heappop(heap)
            idx = len(out.tokens)
            r = nkids.get(parent, 0)
            nkids[parent] = r + 1
            out.tokens.append(t)
            out.parents.append(parent)
            out.freqs.append(-negs)
            out.border_depths.append(-negb)
            out.ranks.append(r)
            out.node_ids.append(g)
            if rel < self.window:
                push(g, idx, rel + 1)
        return out

    def node_string(self, node: int) -> list[int]:
        """Token ids on the path root -> node."""
        out, par, tok = [], self._par, self._tok
        while node > 0:
            out.append(tok[node])
            node = par[node]
        out.reverse()
        return out

    def fail(self, node: int) -> int:
        """The failure link: the node of the longest proper suffix of node's string that is
        a trie path (the root for depth <= 1 and for the root itself)."""
        if not 0 <= node <= self._size:
            raise KeyError(f"no live node {node}")
        s = self.node_string(node)
        for i in range(1, len(s)):
            v = self._walk(s[i:])
            if v >= 0:
                return v
        return 0

    # ----------------------------------------------------------------- pictures
    def snapshot(self, root_token: int | None = None, selected: set[int] | None = None,
                 recent: int = 8, max_nodes: int = 40) -> dict[str, Any]:
        """A JSON-able neighbourhood of the match state for pictures. Touches nothing.

        Nodes by priority, each with its ancestors: the path root -> state, the borders for
        root_token, the state's failure chain, `selected`, the borders' children, the
        `recent` most recently touched nodes, then (to reach 20 nodes) the most frequent
        children of nodes already shown; cut at max_nodes. The root's "fail" is -1.
        """
        max_nodes = max(1, int(max_nodes))
        bs = self._borders(root_token) if root_token is not None else []
        chain: list[int] = []
        v = self._state
        while v > 0:
            v = self.fail(v)
            if v > 0:
                chain.append(v)
        rec: list[int] = []
        seen_rec: set[int] = set()
        for u in reversed(self._recent):
            if len(rec) >= recent:
                break
            if u not in seen_rec and 0 < u <= self._size:
                seen_rec.add(u)
                rec.append(u)
        rec.sort(key=lambda u: -self._touch[u])  # stable: equal clocks keep latest first
        sel = sorted(u for u in (selected or ()) if 0 < u <= self._size)
        bkids = [c for b in bs for _, c in sorted(self._kids[b].items(), key=lambda kv: -self._freq[kv[1]])]

        chosen: dict[int, None] = {0: None}  # ordered set

        def add(u: int) -> bool:
            path = []
            while u > 0 and u not in chosen:
                path.append(u)
                u = self._par[u]
            if len(chosen) + len(path) > max_nodes:
                return False
            for w in reversed(path):
                chosen[w] = None
            return True

        add(self._state)
        for group in (bs, chain, sel, bkids, rec):
            for u in group:
                add(u)
        # Close under failure links where room allows, so the dashed arrows land on drawn nodes.
        pending = list(chosen)
        while pending:
            u = pending.pop()
            f = self.fail(u) if u > 0 else 0
            if f > 0 and f not in chosen and add(f):
                pending.extend(w for w in chosen if w not in pending)
        # Fill up to 20 with the busiest children of what is shown (a readable neighbourhood).
        frontier = list(chosen)
        while len(chosen) < min(20, max_nodes, self._size + 1) and frontier:
            nxt = []
            for u in frontier:
                for c in sorted(self._kids[u].values(), key=lambda c: -self._freq[c]):
                    if len(chosen) >= min(20, max_nodes):
                        break
                    if c not in chosen:
                        chosen[c] = None
                        nxt.append(c)
            frontier = nxt

        bset, selset, recset = set(bs), set(sel), set(rec)
        nodes = []
        for u in sorted(chosen, key=lambda u: (self._dep[u], u)):
            flags = []
            if u == 0:
                flags.append("root")
            if u == self._state:
                flags.append("state")
            if u in bset:
                flags.append("border")
            if u in selset:
                flags.append("selected")
            if u in recset:
                flags.append("recent")
            nodes.append({
                "id": u, "token": self._tok[u], "depth": self._dep[u], "freq": self._freq[u],
                "parent": self._par[u], "fail": -1 if u == 0 else self.fail(u),
                "age": self._step - self._touch[u], "last_touch": self._touch[u], "flags": flags,
            })
        return {
            "nodes": nodes, "state": self._state, "borders": bs,
            "evicted": [dict(e, string=list(e["string"])) for e in self.last_evictions],
            "size": self._size, "capacity": self.capacity, "step": self._step,
            "window": self.window,
        }

    # ------------------------------------------------------------------- checks
    def check_invariants(self) -> None:
        """Brute-force self-check (for tests): structure, uniqueness, buckets, freq, state
        and failure links. O(n * window^2)."""
        n = self._size
        assert 0 <= n <= self.capacity
        for arr in (self._tok, self._par, self._dep, self._freq, self._touch, self._kids, self._inb):
            assert len(arr) == n + 1
        strings: dict[tuple[int, ...], int] = {(): 0}
        for v in range(1, n + 1):
            p = self._par[v]
            assert 0 <= p <= n and self._kids[p].get(self._tok[v]) == v, f"node {v} detached"
            assert self._dep[v] == self._dep[p] + 1 <= self.window
            assert self._freq[v] >= 1
            s = tuple(self.node_string(v))
            assert s not in strings, f"duplicate string {s}"
            strings[s] = v
            assert self._touch[v] <= self._step
        for v in range(n + 1):
            kid_sum = 0
            for t, c in self._kids[v].items():
                assert self._par[c] == v and self._tok[c] == t
                kid_sum += self._freq[c]
            assert kid_sum <= self._freq[v], f"children of {v} count more windows than it"
        # Buckets hold exactly the non-root leaves, under their last touch.
        in_buckets = {}
        for c, b in self._buckets.items():
            assert b, "empty bucket kept"
            for v in b:
                assert v not in in_buckets
                in_buckets[v] = c
        leaves = {v: self._touch[v] for v in range(1, n + 1) if not self._kids[v]}
        assert in_buckets == leaves, "leaf buckets out of sync"
        assert all(self._inb[v] == leaves.get(v, -1) for v in range(1, n + 1))
        assert self._inb[0] == -1
        assert set(self._buckets) <= set(self._clocks)
        # Failure links against the set of strings.
        for s, v in strings.items():
            want = 0
            for i in range(1, len(s)):
                if s[i:] in strings:
                    want = strings[s[i:]]
                    break
            assert self.fail(v) == want, f"fail({v}) wrong"
        # The state: the longest suffix of the context that is a trie path.
        want = 0
        for i in range(len(self._ctx)):
            if tuple(self._ctx[i:]) in strings:
                want = strings[tuple(self._ctx[i:])]
                break
        assert self._state == want, "match state wrong"
