"""Hardware-aware sizing: the choice follows the cost curve and the acceptance estimates."""
import random

import pytest

from racer import DecodeConfig, decode, make_drafter
from racer.costcurve import CostCurve, get_cost_curve
from racer.sizing import AcceptanceModel, Sizer, burst_bucket, choose_size, prune
from racer.tree import DraftTree
from tiny import tiny_lm


def random_tree(rng, size, vocab=50):
    t = DraftTree.root_only(1)
    while len(t) < size:
        p = rng.randrange(len(t))
        t.add(p, rng.randrange(vocab), rng.choice(["retrieval", "logits", "both"]), rng.randrange(4),
              freq=rng.randrange(1, 9))
    return t


def probs_for(tree, q):
    p = [1.0] * len(tree)
    for i in range(1, len(tree)):
        p[i] = p[tree.parents[i]] * q
    return p


def test_empty_draft_when_nothing_is_likely():
    tree = random_tree(random.Random(0), 40)
    keep, expected, _ = choose_size(probs_for(tree, 1e-4), lambda T: 40 + 2 * T)
    assert keep == [0] and expected == 1.0


def test_more_nodes_as_cost_flattens():
    tree = random_tree(random.Random(1), 64)
    probs = probs_for(tree, 0.5)
    sizes = []
    for slope in (8.0, 2.0, 0.5, 0.05, 0.0):
        keep, _, _ = choose_size(probs, lambda T, s=slope: 40 + s * (T - 1))
        sizes.append(len(keep))
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1]
    assert sizes[-1] == 64  # a free forward takes everything with positive probability


@pytest.mark.parametrize("seed", range(20))
def test_choice_is_ancestor_closed_and_prune_is_valid(seed):
    rng = random.Random(seed)
    tree = random_tree(rng, rng.randrange(2, 70))
    model = AcceptanceModel()
    for _ in range(rng.randrange(5)):
        model.update(tree, tree.path_to(rng.randrange(len(tree))))
    probs = model.estimate(tree)
    slope = rng.choice([0.1, 1.0, 5.0])
    keep, _, rates = choose_size(probs, lambda T: 30 + slope * T, max_size=rng.randrange(1, 80))
    kept = set(keep)
    assert 0 in kept and all(tree.parents[i] in kept for i in keep if i)
    small = prune(tree, keep, probs)
    small.validate()
    for new, old in enumerate(keep):
        assert small.tokens[new] == tree.tokens[old] and small.sources[new] == tree.sources[old]


def test_acceptance_model_learns():
    tree = DraftTree.root_only(0)
    a = tree.add(0, 1, "logits", 0)
    b = tree.add(0, 2, "logits", 1)
    m = AcceptanceModel()
    before = m.estimate(tree)
    for _ in range(50):
        m.update(tree, [0, b])
    after = m.estimate(tree)
    assert after[b] > before[b] and after[a] < before[a]


def test_acceptance_depends_on_the_previous_step():
    # The same node is accepted after long accepts and rejected after none: the burst bucket
    # tells the two apart, and an unseen bucket falls back to what the node did overall.
    tree = DraftTree.root_only(0)
    a = tree.add(0, 1, "logits", 0)
    m = AcceptanceModel()
    for _ in range(40):
        m.update(tree, [0, a], burst=3)
        m.update(tree, [0], burst=0)
    hot, cold, unseen = m.estimate(tree, 3)[a], m.estimate(tree, 0)[a], m.estimate(tree, 1)[a]
    assert hot > 0.8 and cold < 0.2 and cold < unseen < hot
    assert [burst_bucket(n) for n in (0, 1, 2, 3, 4, 9)] == [0, 1, 2, 2, 3, 3]


def test_sizer_tracks_the_burst():
    flat = CostCurve([1, 2, 4, 8], [100], [[10.0, 10.5, 11.0, 12.0]], {}, "")
    s = Sizer(flat)
    tree = DraftTree.root_only(0)
    a = tree.add(0, 1, "lookup", 0)
    tree.add(a, 2, "lookup", 0)
    sized = s.size(tree, 100)
    assert sized.info["burst"] == 0
    s.observe(sized, [0, 1, 2], {"forward_ms": 10.0})
    assert s.size(tree, 100).info["burst"] == burst_bucket(2)
    assert Sizer(flat, burst=False).burst == 0


def test_cost_curve_interpolates():
    c = CostCurve([1, 8, 64], [100, 1000], [[10, 20, 80], [20, 40, 160]], {})
    assert c.t(1, 100) == 10 and c.t(8, 1000) == 40
    assert c.t(36, 100) == pytest.approx(50) and c.t(8, 550) == pytest.approx(30)
    assert c.t(128, 100) > c.t(64, 100)


def test_auto_capacity_is_lossless(tmp_path, monkeypatch):
    monkeypatch.setenv("RACER_CACHE", str(tmp_path))
    lm = tiny_lm(vocab=96)
    curve = get_cost_curve(lm)
    assert list(curve.sizes)[:3] == [1, 2, 4] and all(m > 0 for row in curve.ms for m in row)
    assert any(tmp_path.rglob("*.json"))  # cached on disk
    rng = random.Random(5)
    for _ in range(3):
        chunk = [rng.randrange(96) for _ in range(5)]
        prompt = (chunk * 4 + [rng.randrange(96) for _ in range(6)])[:26]
        ref = decode(lm, prompt, make_drafter("ar"), DecodeConfig(max_new_tokens=50, capacity=1)).token_ids
        for method in ("racer", "tr", "pld"):
            run_cfg = DecodeConfig(max_new_tokens=50, capacity="auto")
            steps = []
            res = decode(lm, prompt, make_drafter(method, vocab_size=96), run_cfg, on_step=steps.append)
            assert res.token_ids == ref, method
            for s in steps:
                if s.forwarded:
                    assert s.info["chosen_T"] == len(s.tree) and s.info["expected_accept"] >= 1.0
                    assert "sizing_ms" in s.timings


def test_sizer_keeps_state_across_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("RACER_CACHE", str(tmp_path))
    lm = tiny_lm(vocab=96)
    # A flat synthetic curve: drafting always pays, so every step has nodes to learn from
    # (a curve measured on a busy machine could rightly choose no draft at all).
    sizer = Sizer(CostCurve([1, 64], [16], [[10.0, 10.0]], {}))
    prompt = [3, 4, 5, 6] * 6
    decode(lm, prompt, make_drafter("racer", vocab_size=96), DecodeConfig(max_new_tokens=30), sizer=sizer)
    n = sum(c[1] for c in sizer.model.counts.values())
    decode(lm, prompt, make_drafter("racer", vocab_size=96), DecodeConfig(max_new_tokens=30), sizer=sizer)
    assert sum(c[1] for c in sizer.model.counts.values()) > n > 0


def test_sizer_explores_when_it_would_never_draft():
    # A steep curve and pessimistic priors choose no draft; exploration still tries a few
    # nodes now and then, so acceptance can be learned.
    sizer = Sizer(CostCurve([1, 2, 64], [16], [[10.0, 1000.0, 5000.0]], {}))
    tree = random_tree(random.Random(3), 30)
    sizes = [len(sizer.size(tree, 100)) for _ in range(40)]
    assert sizes.count(1) >= 35 and any(s > 1 for s in sizes)
    # The kept nodes after exploration are still ancestor-closed (prune validates).
