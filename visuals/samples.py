"""Synthetic, deterministic sample data for the gallery, the docs and the tests.

Shaped exactly like what the decode loop and the benchmark produce (StepRecord, automaton
snapshots, race points, cost curves, benchmark summaries), so every figure can be seen and
tested without a model. `decode` maps the sample token ids to text.
"""
from __future__ import annotations

import random
from typing import Any

from racer.records import StepRecord
from racer.tree import DraftTree

#: A small vocabulary with the awkward cases: leading spaces, newlines, indents, HTML-ish
#: characters, a long token and a CJK token.
VOCAB = [
    "<s>", " the", " cat", " sat", " on", " mat", ".", "\n", " The", " dog", " ran", " to",
    " a", " and", ",", " it", " was", " very", " happy", " in", " house", " garden", "\n\n",
    "def", " add", "(", "a", ",", " b", "):", "    ", "return", " +", "\t", " is", " of",
    " implementation", " <", "&", ">", " 的", " then", " slept", " warm", " sun", " morning",
    " every", " day", " small", " black", " white", " old", " new", " big", " red", " tree",
    " under", " near", " by", " with", " his", " her", " their", " friend", " played", " ball",
    " all", " afternoon", " when", " came", " home", " ate", " dinner", " after", " that",
    " quietly", " again", " later", " soon", " also", "!", "?", " \"", "\"", " yes", " no",
]


def decode(token: int) -> str:
    return VOCAB[token] if 0 <= token < len(VOCAB) else f"<{token}>"


def _tok(text: str) -> int:
    return VOCAB.index(text)


def racer_tree(capacity: int = 64, seed: int = 0) -> tuple[DraftTree, list[int]]:
    """A RACER-like merged tree: retrieval chains from two borders first, then a logits tree
    grown breadth-first with the paper's halving breadth rule, up to `capacity` nodes.
    Returns the tree and its accepted path (root first)."""
    rng = random.Random(seed)
    root = _tok(" cat")
    tree = DraftTree.root_only(root)
    # retrieval: what followed "the cat" / "cat" before in the context
    chains = [
        ([" sat", " on", " the", " mat", ".", "\n", " The"], 3),
        ([" sat", " in", " the", " sun", " every", " morning"], 2),
        ([" ran", " to", " the", " garden", "."], 1),
        ([" was", " very", " happy", "."], 1),
        ([" slept", " quietly", " again"], 1),
    ]
    for words, freq in chains:
        parent = 0
        for d, w in enumerate(words):
            if len(tree) >= capacity:
                break
            parent = tree.add(parent, _tok(w), "retrieval", 0, freq=freq, border_depth=2 if freq > 1 else 1)
    # logits: copy-logit rows, paper rule: child j of node i gets max(1, b_i >> (j + [i != root]))
    queue = [(0, 8)]
    while queue and len(tree) < capacity:
        node, breadth = queue.pop(0)
        row = rng.sample(range(1, len(VOCAB)), 8)
        if node == 0:
            row = [_tok(" sat"), _tok(" was"), _tok(" and"), _tok(" is"), _tok(","), _tok(" played"),
                   _tok(" ate"), _tok(" came")]
        for j in range(breadth):
            if len(tree) >= capacity:
                break
            b = max(1, breadth >> (j + (node != 0)))
            before = len(tree)
            child = tree.add(node, row[j], "logits", j, breadth=b)
            if len(tree) > before or tree.sources[child] == "both":
                queue.append((child, b))
    tree.validate()
    path = [0]
    for w in [" sat", " on", " the", " mat"]:
        path.append(tree.child(path[-1], _tok(w)))
    return tree, path


def step_record(capacity: int = 64, index: int = 7, seed: int = 0) -> StepRecord:
    tree, path = racer_tree(capacity, seed)
    committed = [tree.tokens[i] for i in path]
    by_src: dict[str, int] = {}
    for i in path[1:]:
        by_src[tree.sources[i]] = by_src.get(tree.sources[i], 0) + 1
    info = {
        "match_depth": 3, "borders": [{"node": 5, "depth": 3, "tokens": [_tok(" on"), _tok(" the"), root_tok()]},
                                       {"node": 3, "depth": 2, "tokens": [_tok(" the"), root_tok()]}],
        "n_retrieval": tree.sources.count("retrieval"), "n_logits": tree.sources.count("logits"),
        "n_both": tree.sources.count("both"), "capacity": capacity, "accepted_by_source": by_src,
        # as the default RACER drafter reports its prompt-lookup chain (none in this sample step)
        "n_lookup": tree.sources.count("lookup"), "chain_len": 0,
        "evicted": [], "automaton_size": 412,
    }
    return StepRecord(index=index, root=tree.tokens[0], tree=tree, accepted=path, committed=committed,
                      next_root=_tok("."), context_len=120 + index * 3,
                      timings={"draft_ms": 0.9, "forward_ms": 71.0, "verify_ms": 0.4, "cache_ms": 1.3,
                               "update_ms": 0.6, "sizing_ms": 0.05},
                      forwarded=True, info=info)


def root_tok() -> int:
    return _tok(" cat")


def big_step_record(capacity: int = 120) -> StepRecord:
    """Beyond the labelled size: only the accepted path gets labels."""
    return step_record(capacity=capacity, index=9, seed=3)


def small_step_record() -> StepRecord:
    tree = DraftTree.root_only(_tok(" the"))
    a = tree.add(0, _tok(" cat"), "retrieval", 0, freq=4)
    b = tree.add(a, _tok(" sat"), "both", 0, freq=2, breadth=4)
    tree.add(b, _tok(" on"), "retrieval", 0, freq=2)
    tree.add(a, _tok(" ran"), "logits", 1, breadth=2)
    c = tree.add(0, _tok(" dog"), "logits", 1, breadth=4)
    tree.add(c, _tok("\n"), "logits", 0, breadth=2)
    tree.add(0, _tok(" <"), "logits", 2, breadth=2)
    return StepRecord(index=3, root=tree.tokens[0], tree=tree, accepted=[0, a, b], committed=[tree.tokens[i] for i in (0, a, b)],
                      next_root=_tok(" in"), context_len=40, timings={"draft_ms": 0.3, "forward_ms": 30.0,
                                                                       "verify_ms": 0.1, "cache_ms": 0.5, "update_ms": 0.2},
                      info={"accepted_by_source": {"retrieval": 1, "both": 1}})


# --------------------------------------------------------------------------------------------
# automaton snapshot: a real Aho–Corasick trie over the n-grams of a sample context

STORY = (" The cat sat on the mat . \n The dog ran to the garden . \n The cat sat in the sun every morning . \n"
         " The dog sat on the mat and the cat ran to the house . \n The cat")


def story_tokens() -> list[int]:
    return [_tok(" " + w) if (" " + w) in VOCAB else _tok(w) for w in STORY.split(" ") if w]


def automaton_snapshot(window: int = 5, step: int = 40, evict: int = 2) -> dict[str, Any]:
    """Build the trie of every `window`-gram of the story (touch = insert step), compute correct
    failure links, match state and borders, and return the snapshot dict the drafter emits."""
    toks = story_tokens()
    nodes = [{"id": 0, "token": -1, "depth": 0, "freq": 0, "parent": -1, "fail": -1, "last_touch": 0,
              "children": {}}]
    for end in range(1, len(toks) + 1):
        t_insert = max(0, step - (len(toks) - end))   # later windows were inserted more recently
        window_toks = toks[max(0, end - window):end]
        v = 0
        nodes[0]["last_touch"] = t_insert
        for t in window_toks:
            c = nodes[v]["children"].get(t)
            if c is None:
                c = len(nodes)
                nodes.append({"id": c, "token": t, "depth": nodes[v]["depth"] + 1, "freq": 0, "parent": v,
                              "fail": 0, "last_touch": t_insert, "children": {}})
                nodes[v]["children"][t] = c
            nodes[c]["freq"] += 1
            nodes[c]["last_touch"] = t_insert
            v = c
    # failure links, BFS
    queue = list(nodes[0]["children"].values())
    while queue:
        v = queue.pop(0)
        for t, c in nodes[v]["children"].items():
            f = nodes[v]["fail"]
            while f > 0 and t not in nodes[f]["children"]:
                f = nodes[f]["fail"]
            nodes[c]["fail"] = nodes[f]["children"].get(t, 0) if nodes[f]["children"].get(t, 0) != c else 0
            queue.append(c)
    # match state: deepest node whose string is a suffix of the context
    state = 0
    for t in toks:
        while state > 0 and t not in nodes[state]["children"]:
            state = nodes[state]["fail"]
        state = nodes[state]["children"].get(t, 0)
    borders, b = [], state
    while b > 0:
        if nodes[b]["depth"] >= 2:
            borders.append(b)
        b = nodes[b]["fail"]
    for x in [state] + borders:
        nodes[x]["last_touch"] = step
    out_nodes = []
    for n in nodes:
        flags = []
        if n["id"] == 0:
            flags.append("root")
        if n["id"] == state:
            flags.append("state")
        if n["id"] in borders:
            flags.append("border")
        if any(n["id"] in _subtree(nodes, bb) and n["id"] != bb for bb in borders[:1]):
            flags.append("selected")
        if n["last_touch"] == step:
            flags.append("recent")
        out_nodes.append({"id": n["id"], "token": n["token"], "depth": n["depth"], "freq": n["freq"],
                          "parent": n["parent"], "fail": n["fail"], "age": step - n["last_touch"],
                          "last_touch": n["last_touch"], "flags": flags})
    evicted = [{"id": 900 + i, "token": toks[3 + i], "depth": 3, "string": toks[1 + i:4 + i]} for i in range(evict)]
    return {"nodes": out_nodes, "state": state, "borders": borders, "evicted": evicted,
            "size": 9734, "capacity": 10000, "step": step, "window": window}


def _subtree(nodes, v):
    out, stack = set(), [v]
    while stack:
        x = stack.pop()
        out.add(x)
        stack.extend(nodes[x]["children"].values())
    return out


def brute_fail(snapshot: dict[str, Any]) -> dict[int, int]:
    """Failure links by brute force (longest proper suffix present in the trie), for tests."""
    by_id = {n["id"]: n for n in snapshot["nodes"]}

    def string(v):
        s = []
        while v > 0:
            s.append(by_id[v]["token"])
            v = by_id[v]["parent"]
        return tuple(reversed(s))
    index = {string(v): v for v in by_id}
    out = {}
    for v in by_id:
        if v == 0:
            continue
        s = string(v)
        out[v] = next((index[s[k:]] for k in range(1, len(s)) if s[k:] in index), 0)
    return out


# --------------------------------------------------------------------------------------------
# whole-decode samples

def decode_steps(n_steps: int = 24, seed: int = 1) -> list[StepRecord]:
    """A short run of steps with varied acceptance (for text spans and acceptance plots)."""
    rng = random.Random(seed)
    stream = story_tokens()[1:] * 4      # the text the steps commit, in order
    pos = 0
    steps = []
    for k in range(n_steps):
        tree = DraftTree.root_only(stream[pos])
        pos += 1
        path = [0]
        n_acc = rng.choice([0, 0, 1, 1, 1, 2, 2, 3, 4, 6])
        for j in range(n_acc):
            src = rng.choice(["retrieval", "retrieval", "logits", "both"])
            path.append(tree.add(path[-1], stream[pos], src, 0, freq=2))
            pos += 1
        for _ in range(rng.randrange(3, 10)):
            p = rng.randrange(len(tree))
            tree.add(p, rng.randrange(1, len(VOCAB)), rng.choice(["retrieval", "logits"]), 1)
        committed = [tree.tokens[i] for i in path]
        by_src: dict[str, int] = {}
        for i in path[1:]:
            by_src[tree.sources[i]] = by_src.get(tree.sources[i], 0) + 1
        steps.append(StepRecord(index=k, root=tree.tokens[0], tree=tree, accepted=path, committed=committed,
                                next_root=rng.randrange(1, len(VOCAB)), context_len=50 + k,
                                timings={"draft_ms": 0.8 + rng.random() * 0.4, "forward_ms": 60 + rng.random() * 10,
                                         "verify_ms": 0.3, "cache_ms": 1.1, "update_ms": 0.5},
                                info={"accepted_by_source": by_src}))
    # the next root of step k is the root of step k+1
    for a, b in zip(steps, steps[1:]):
        a.next_root = b.root
    return steps


def race_data() -> dict[str, dict[str, Any]]:
    """{method: {"points": [(elapsed_s, tokens)], "final": {"tokens_per_s", "mat"}}}."""
    rng = random.Random(5)
    out = {}
    for method, step_ms, mat in (("ar", 41.0, 1.0), ("token_recycling", 66.0, 2.3), ("racer", 58.0, 2.8)):
        t, n, pts = 0.0, 0, [(0.0, 0)]
        steps = 0
        while n < 200:
            t += step_ms * (0.9 + 0.2 * rng.random()) / 1000
            n += 1 if mat == 1.0 else max(1, min(8, round(rng.expovariate(1 / (mat - 0.6)))))
            steps += 1
            pts.append((round(t, 4), min(n, 200)))
        out[method] = {"points": pts, "final": {"tokens_per_s": min(n, 200) / t, "mat": min(n, 200) / steps}}
    return out


def accept_lengths() -> dict[str, list[int]]:
    rng = random.Random(2)
    return {
        "ar": [1] * 200,
        "token_recycling": [max(1, min(8, 1 + int(rng.expovariate(1 / 1.3)))) for _ in range(90)],
        "racer": [max(1, min(10, 1 + int(rng.expovariate(1 / 1.8)))) for _ in range(75)],
    }


def latency_data() -> dict[str, dict[str, Any]]:
    """DecodeResult.to_dict()-shaped: timings are totals over the run, in ms."""
    return {
        "ar": {"timings": {"forward_ms": 8200.0, "verify_ms": 40.0, "cache_ms": 0.0}, "steps": 200, "new_tokens": 200},
        "token_recycling": {"timings": {"draft_ms": 95.0, "forward_ms": 5900.0, "verify_ms": 60.0,
                                        "cache_ms": 120.0, "update_ms": 150.0}, "steps": 87, "new_tokens": 200},
        "racer": {"timings": {"draft_ms": 160.0, "forward_ms": 4100.0, "verify_ms": 45.0, "cache_ms": 95.0,
                              "update_ms": 210.0, "sizing_ms": 12.0}, "steps": 71, "new_tokens": 200},
    }


def cost_curve() -> dict[str, Any]:
    """DESIGN §4: SmolLM2-135M bfloat16 on 2 CPU cores, plus an E(T) curve."""
    sizes = [1, 4, 8, 12, 16, 24, 32, 48, 64]
    ms = [25.0, 26.0, 27.0, 30.0, 33.0, 39.0, 46.0, 59.0, 72.0]
    expected = [1.0, 1.9, 2.3, 2.5, 2.65, 2.8, 2.9, 3.0, 3.05]
    return {"sizes": sizes, "ms": ms, "expected_tokens": expected, "chosen_T": 8,
            "hardware": "2 CPU cores, bfloat16, SmolLM2-135M"}


def benchmark_summary() -> dict[str, Any]:
    cats = ["mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag", "humaneval", "mgsm"]
    rng = random.Random(4)
    methods: dict[str, Any] = {}
    for m, base_mat, base_sp in (("ar", 1.0, 1.0), ("token_recycling", 2.5, 1.45), ("racer", 2.9, 1.7)):
        catd = {}
        for c in cats:
            bump = {"summarization": 0.5, "rag": 0.45, "humaneval": 0.3, "mgsm": 0.5, "translation": -0.3}.get(c, 0.0)
            mat = 1.0 if m == "ar" else base_mat + bump + rng.uniform(-0.15, 0.15)
            sp = 1.0 if m == "ar" else base_sp * mat / base_mat
            catd[c] = {"mat": round(mat, 3), "tokens_per_s": round(24 * sp, 2), "speedup_vs_ar": round(sp, 3)}
        overall = {k: round(sum(v[k] for v in catd.values()) / len(catd), 3) for k in ("mat", "tokens_per_s", "speedup_vs_ar")}
        methods[m] = {"overall": overall, "categories": catd}
    return {"methods": methods, "hardware": "2 CPU cores", "model": "SmolLM2-135M-Instruct"}


def word(token: int) -> str:
    """Sample text for any token id (the tiny random model's ids, in the anatomy gallery): the
    ids wrap around VOCAB, so labels have the widths and whitespace of real text."""
    return VOCAB[int(token) % len(VOCAB)] if int(token) >= 0 else "<none>"
