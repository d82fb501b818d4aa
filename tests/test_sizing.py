"""Hardware-aware sizing: the choice follows the cost curve and the acceptance estimates."""
import random

import numpy as np
import pytest

from racer import DecodeConfig, decode, make_drafter
from racer.costcurve import PREFILL_TOKENS, CostCurve, get_cost_curve
from racer import sizing
from racer.sizing import AcceptanceModel, Sizer, burst_bucket, choose_size, conf_bucket, p_bucket, prune
from racer.tree import DraftTree
from racer.tiny import tiny_lm


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
        assert small.meta[new] == {**tree.meta[old], "p_accept": round(probs[old], 4)}
        assert small.meta[new] is not tree.meta[old] or len(keep) == len(tree)
        if new:
            assert small.child(small.parents[new], small.tokens[new]) == new
    if len(keep) > 1:
        with pytest.raises(ValueError, match="parent"):
            prune(tree, keep[1:])  # without the root
    deep = [i for i in range(1, len(tree)) if tree.parents[i] > 0]
    if deep:
        with pytest.raises(ValueError, match="parent"):
            prune(tree, [0, deep[0]])  # without its parent
        with pytest.raises(ValueError, match="sorted"):
            prune(tree, [0, deep[0], tree.parents[deep[0]]])  # a child before its parent


@pytest.mark.parametrize("seed", range(8))
def test_estimate_is_the_product_of_each_node_s_q_along_its_path(seed):
    """`estimate` shares q between the nodes of one bucket; each node's P must still be the product
    of `_q` of its own `features` along its path, in learned and unlearned buckets, every source,
    chain runs, probabilities, cold and agreeing rows."""
    rng = random.Random(seed)
    tree = DraftTree.root_only(1)
    while len(tree) < 60:
        p = rng.randrange(len(tree))
        meta = rng.choice([{}, {"freq": rng.randrange(1, 9), "border_depth": rng.randrange(6)},
                           {"p_row": rng.random()}, {"lookup": 1, "run": rng.randrange(1, 30)},
                           {"cold": 1, "p_row": rng.random()}, {"agree": 1, "p_row": rng.random()}])
        tree.add(p, rng.randrange(30), rng.choice(["retrieval", "logits", "both", "lookup"]), rng.randrange(6), **meta)
    model = AcceptanceModel()
    for _ in range(30):
        model.update(tree, tree.path_to(rng.randrange(len(tree))), rng.randrange(4), rng.randrange(-1, 4))
    for burst, conf in ((0, -1), (2, 1), (3, 3)):
        got = model.estimate(tree, burst, conf)
        sib = model._sibling_freq(tree)
        for i in range(1, len(tree)):
            up = got[tree.parents[i]]
            want = up * model._q(model.features(tree, i, sib, burst, conf)[-1]) if up >= sizing.NEGLIGIBLE else 0.0
            assert got[i] == want


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


def test_acceptance_depends_on_the_models_confidence_in_the_root():
    # The same node after the same burst is accepted below a confident root and rejected below
    # an unsure one: the confidence bucket tells them apart; an unseen one falls back to the mix.
    tree = DraftTree.root_only(0)
    a = tree.add(0, 1, "lookup", 0)
    m = AcceptanceModel()
    for _ in range(40):
        m.update(tree, [0, a], burst=1, conf=3)
        m.update(tree, [0], burst=1, conf=0)
    sure, unsure, unseen = (m.estimate(tree, 1, c)[a] for c in (3, 0, 1))
    assert sure > 0.8 and unsure < 0.2 and unsure < unseen < sure
    assert [conf_bucket(p) for p in (None, float("nan"), 0.0, 0.29, 0.3, 0.6, 0.89, 0.9, 1.0)] == \
        [-1, -1, 0, 0, 1, 2, 2, 3, 3]


def test_sizer_reads_the_confidence_at_the_last_accepted_node():
    flat = CostCurve([1, 2, 4, 8], [100], [[10.0, 10.5, 11.0, 12.0]], {}, "")
    tree = DraftTree.root_only(0)
    a = tree.add(0, 1, "lookup", 0)
    tree.add(a, 2, "lookup", 0)
    topk_p = np.array([[0.2, 0.1], [0.95, 0.01], [0.5, 0.3]], dtype=np.float32)
    s = Sizer(flat)
    sized = s.size(tree, 100)
    assert sized.info["conf"] == -1                          # nothing known before the first step
    s.observe(sized, [0, 1], {"forward_ms": 10.0}, topk_p=topk_p)
    assert s.size(tree, 100).info["conf"] == conf_bucket(0.95) == 3   # node 1 fixed the next root
    s.observe(sized, [0, 1, 2], {"forward_ms": 10.0}, topk_p=topk_p)
    assert s.conf == conf_bucket(0.5)
    s.observe(sized, [0], {"forward_ms": 10.0})              # a step without probabilities
    assert s.conf == -1
    off = Sizer(flat, confidence=False)
    off.observe(off.size(tree, 100), [0, 1], {"forward_ms": 10.0}, topk_p=topk_p)
    assert off.conf == -1 and off.settings["confidence"] is False


def test_cost_curve_interpolates():
    c = CostCurve([1, 8, 64], [100, 1000], [[10, 20, 80], [20, 40, 160]], {})
    assert c.t(1, 100) == 10 and c.t(8, 1000) == 40
    assert c.t(36, 100) == pytest.approx(50) and c.t(8, 550) == pytest.approx(30)
    assert c.t(128, 100) > c.t(64, 100)


def test_prefill_time_follows_its_own_points():
    c = CostCurve([1, 8, 64], [128], [[10, 20, 80]], {}, "", [16, 64, 256, 1024], [20.0, 60.0, 250.0, 1200.0])
    assert [c.prefill(n) for n in (16, 64, 256, 1024)] == [20.0, 60.0, 250.0, 1200.0]
    assert c.prefill(40) == pytest.approx(40.0) and c.prefill(640) == pytest.approx(725.0)
    # Below the shortest: from the one-token forward up to it.
    assert c.prefill(1) == 10 and c.prefill(8) == pytest.approx(10 + 7 / 15 * 10)
    # Beyond the longest: the parabola through the last three (attention grows with the square),
    # never below the last segment's line.
    a, b, cc = np.polyfit([64, 256, 1024], [60.0, 250.0, 1200.0], 2)
    assert c.prefill(2048) == pytest.approx(a * 2048 ** 2 + b * 2048 + cc)
    assert c.prefill(2048) >= 1200 + (1200 - 250) / 768 * 1024
    # A curve cached before prefills were timed falls back to the tree curve at the first context.
    old = CostCurve(**{k: v for k, v in c.to_dict().items() if not k.startswith("prefill")})
    assert old.prefill_tokens == [] and old.prefill(300) == old.t(300, 0)


@pytest.mark.parametrize("contexts", [[16], [128, 512, 1536]])
def test_cost_curve_rows_equal_single_sizes(contexts):
    rng = random.Random(len(contexts))
    sizes = [1, 2, 4, 8, 16, 64]
    ms = [sorted(rng.uniform(5, 50) for _ in sizes) for _ in contexts]
    curve = CostCurve(sizes, contexts, ms, {})
    for context in (1, 16, 128, 300, 512, 1000, 1536, 4000):
        for n in (1, 7, 64, 90):
            assert curve.ts(n, context) == [curve.t(T, context) for T in range(1, n + 1)]


def test_auto_capacity_is_lossless(tmp_path, monkeypatch):
    monkeypatch.setenv("RACER_CACHE", str(tmp_path))
    lm = tiny_lm(vocab=96)
    curve = get_cost_curve(lm)
    assert list(curve.sizes)[:3] == [1, 2, 4] and all(m > 0 for row in curve.ms for m in row)
    # The prefills it timed: the lengths the tiny model's context holds, never cheaper when longer.
    assert curve.prefill_tokens == [n for n in PREFILL_TOKENS if n < lm.max_context] and len(curve.prefill_tokens) > 2
    assert all(0 < a <= b for a, b in zip(curve.prefill_ms, curve.prefill_ms[1:]))
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


def test_acceptance_separates_confident_rows_from_flat_ones():
    # Two rank-0 copy-logit nodes: one from a row whose top entry had probability 0.9, one
    # from a flat row (0.1). Before any data the prior already ranks them apart; after the
    # confident kind is always accepted and the flat kind never, the estimates follow.
    tree = DraftTree.root_only(0)
    sure = tree.add(0, 1, "logits", 0, p_row=0.9)
    flat = tree.add(sure, 2, "logits", 0, p_row=0.1)
    other = tree.add(0, 3, "logits", 0)
    m = AcceptanceModel()
    p0 = m.estimate(tree)
    assert p0[sure] > 3 * (p0[flat] / p0[sure]) and p0[other] > 0
    for _ in range(40):
        m.update(tree, [0, sure])
    p1 = m.estimate(tree)
    assert p1[sure] > 0.85 and p1[flat] / p1[sure] < 0.1
    assert [p_bucket(p) for p in (None, -1.0, 0.0, 0.05, 0.3, 0.6, 0.99)] == [-1, -1, 0, 1, 2, 3, 4]


def test_nodes_below_a_negligible_one_are_not_estimated():
    # A chain of flat-row logits nodes: P falls by about 0.015 a level, so from depth 2 it is under
    # NEGLIGIBLE and everything below gets 0, which sizing never keeps; above it the estimate is
    # the full product.
    tree = DraftTree.root_only(0)
    at = 0
    for t in range(1, 6):
        at = tree.add(at, t, "logits", 0, p_row=0.01)
    sure = tree.add(0, 9, "logits", 0, p_row=0.9)
    p = AcceptanceModel().estimate(tree)
    assert p[1] == pytest.approx(0.015, rel=0.05) and p[2] == pytest.approx(p[1] * 0.015, rel=0.05)
    assert p[2] < sizing.NEGLIGIBLE and p[3:6] == [0.0, 0.0, 0.0] and p[sure] > 0.3
    keep, _, _ = choose_size(p, lambda T: 10.0, 0.0)   # nodes free: everything that may pay is kept
    assert keep == [0, 1, 2, sure]


def test_loop_hands_row_probabilities_to_the_drafter():
    # The probabilities the loop computes are the model's softmax at the top-k ids.
    import torch

    from racer.loop import top_k
    logits = torch.randn(3, 40)
    ids, p = top_k(logits, 5, True)
    want = torch.softmax(logits, -1).gather(-1, torch.as_tensor(ids))
    assert torch.allclose(torch.as_tensor(p), want, atol=1e-6)
    assert top_k(logits, 5, False)[1] is None
    lm = tiny_lm(vocab=96)
    d = make_drafter("racer", vocab_size=96)
    decode(lm, [3, 4, 5, 6] * 6, d, DecodeConfig(max_new_tokens=20, capacity=8))
    rows = d.store.table[:, 0] >= 0
    assert rows.any() and (d.store.probs[rows, 0] > 0).all() and (d.store.probs[rows, 0] <= 1).all()
    assert (np.diff(d.store.probs[rows], axis=1) <= 1e-6).all()  # best first


def test_calibration_follows_observed_forwards():
    from racer.sizing import ForwardCalibration
    c = ForwardCalibration(min_count=3)
    assert c.factor(4) == 1.0
    for _ in range(3):
        c.observe(1, 8.0, 10.0)
    assert c.factor(1) == pytest.approx(0.8)
    assert c.factor(6) == pytest.approx(0.8)  # unseen size: the nearest smaller one's ratio
    for _ in range(50):
        c.observe(4, 13.0, 10.0)
    assert c.factor(4) == pytest.approx(1.3) and c.factor(7) == pytest.approx(1.3) and c.factor(2) == pytest.approx(0.8)
    assert c.bucket(16) == 16 and c.bucket(17) == c.bucket(32) == 32
    c.observe(4, 0.0, 10.0)  # a missing timing changes nothing
    assert c.factor(4) == pytest.approx(1.3)
    for _ in range(3):
        c.observe(40, 20.0, 10.0)
    assert c.factors(70) == [c.factor(T) for T in range(1, 71)] and c.factor(20) == pytest.approx(1.3)
    assert c.factor(33) == c.factor(64) == pytest.approx(2.0)


def test_sizer_drafts_less_when_its_forwards_run_over_the_curve():
    # The curve says trees are nearly free; this decoding's forwards say every extra node
    # costs 40 % of a one-token forward. After calibration the sizer keeps fewer nodes than a
    # fresh one with the same acceptance estimates.
    curve = CostCurve([1, 2, 4, 8, 16], [100], [[10.0, 10.2, 10.4, 10.8, 11.6]], {}, "")
    tree = random_tree(random.Random(2), 16)
    fresh, slow = Sizer(curve), Sizer(curve, calibrate=True)
    for T in range(1, 17):
        for _ in range(3):
            slow.calibration.observe(T, 10.0 * (1 + 0.4 * (T - 1)), curve.t(T, 100))
    a, b = slow.size(tree, 100), fresh.size(tree, 100)
    assert len(a) < len(b)
    assert a.info["cost_ms"][3] == pytest.approx(22.0, rel=0.01) and b.info["cost_ms"][3] == pytest.approx(curve.t(4, 100), abs=0.01)
    # The decode loop's timings reach the calibration: the size it chose and its forward ms.
    n = sum(slow.calibration.count.values())
    slow.observe(a, [0], {"forward_ms": 12.0, "draft_ms": 0.1})
    assert sum(slow.calibration.count.values()) == n + 1


@pytest.mark.parametrize("skip", [True, False])
def test_a_disturbed_forward_teaches_the_sizer_nothing(skip):
    # A forward DISTURBED x over the curve measured the machine's load, not the tree: the sizer
    # keeps its calibration and overhead (so load does not shrink the trees a race draws), but
    # still learns what was accepted. skip_disturbed=False (how version-1 traces were recorded)
    # learns from it like any other.
    from racer.sizing import DISTURBED
    curve = CostCurve([1, 2, 4, 8, 16], [100], [[10.0, 10.2, 10.4, 10.8, 11.6]], {}, "")
    tree = random_tree(random.Random(3), 16)
    sizer = Sizer(curve, skip_disturbed=skip, calibrate=True)
    assert sizer.settings["skip_disturbed"] is skip
    kept = sizer.size(tree, 100)
    predicted = curve.t(len(kept), 100)
    accepted = [0] + [i for i in range(1, len(kept)) if kept.parents[i] == 0][:1]
    sizer.observe(kept, accepted, {"forward_ms": DISTURBED * predicted * 1.01, "draft_ms": 9.0})
    if skip:
        assert sizer.calibration.count == {} and sizer.overhead_ms == 1.0
    else:
        assert sum(sizer.calibration.count.values()) == 1 and sizer.overhead_ms == pytest.approx(0.9 + 0.9)
    # A quiet forward is learnt either way; picture data (the page's work) is not overhead.
    kept = sizer.size(tree, 100)
    before = sizer.overhead_ms
    sizer.observe(kept, [0], {"forward_ms": curve.t(len(kept), 100), "draft_ms": 0.5, "picture_ms": 50.0})
    assert sizer.overhead_ms == pytest.approx(0.9 * before + 0.05)
    assert sum(sizer.calibration.count.values()) == (1 if skip else 2)


def test_acceptance_is_learnt_from_a_disturbed_step_too():
    from racer.sizing import DISTURBED
    curve = CostCurve([1, 2, 4, 8, 16], [100], [[10.0, 10.2, 10.4, 10.8, 11.6]], {}, "")
    tree = random_tree(random.Random(4), 16)
    quiet, busy = Sizer(curve), Sizer(curve)
    kept = quiet.size(tree, 100)
    assert busy.size(tree, 100).tokens == kept.tokens
    path = [0] + [i for i in range(1, len(kept)) if kept.parents[i] == 0][:1]
    before = quiet.model.estimate(tree, quiet.burst)
    for s, ms in ((quiet, 1.0), (busy, DISTURBED * 3)):
        s.observe(kept, path, {"forward_ms": ms * curve.t(len(kept), 100)})
    # The same acceptance evidence, whatever the clock said.
    assert busy.burst == quiet.burst
    assert busy.model.estimate(tree, busy.burst) == quiet.model.estimate(tree, quiet.burst) != before


def test_an_uncalibrated_sizer_decides_from_the_curve_alone():
    # The default: the trees depend on the curve and what was accepted, never on how long this
    # decoding's own forwards happened to take.
    curve = CostCurve([1, 2, 4, 8, 16], [100], [[10.0, 10.2, 10.4, 10.8, 11.6]], {}, "")
    tree = random_tree(random.Random(5), 16)
    a, b = Sizer(curve), Sizer(curve)
    assert a.settings["calibrate"] is False
    for s, ms in ((a, 1.0), (b, 1.45)):          # b's forwards ran 45 % over: quiet, but slow
        for _ in range(8):
            kept = s.size(tree, 100)
            s.observe(kept, [0], {"forward_ms": ms * curve.t(len(kept), 100), "draft_ms": 0.4})
    assert a.calibration.count == b.calibration.count == {}
    assert a.size(tree, 100).tokens == b.size(tree, 100).tokens


def test_match_run_counts_how_far_the_match_agrees_backwards():
    from racer.drafters.pld import MAX_RUN, PLDDrafter, match_run
    ctx = [7, 1, 2, 3, 4, 5, 6, 8, 0, 2, 3, 4]      # the root 5 follows: "2 3 4 5" occurred before
    assert match_run(ctx, 5, 5) == 4                # 5, 4, 3, 2 agree; 1 against 0 does not
    tree = PLDDrafter().propose(ctx, 5, 8)
    assert tree.tokens[1:4] == [6, 8, 0] and tree.info["match_len"] == 3 and tree.info["match_run"] == 4
    long = list(range(40)) + list(range(39))         # the root 39 closes a 40-token repeat
    assert match_run(long, 39, 39) == MAX_RUN


def test_racer_chain_nodes_carry_their_match_run():
    ctx = [9, 1, 2, 3, 4, 5, 6, 7, 8, 20, 21, 1, 2, 3, 4]
    d = make_drafter("racer", vocab_size=32)
    d.start(ctx, 0, None)
    tree = d.propose(ctx, 5, 12)
    chain = [i for i in range(1, len(tree)) if tree.meta[i].get("lookup")]
    assert [tree.tokens[i] for i in chain][:3] == [6, 7, 8]
    assert all(tree.meta[i]["run"] == 5 for i in chain)


def _chain(run: int) -> DraftTree:
    t = DraftTree.root_only(1)
    at = 0
    for tok in (2, 3, 4):
        at = t.add(at, tok, "lookup", 0, lookup=1, run=run)
    return t


def test_a_chain_whose_match_runs_far_back_is_judged_likelier():
    m = AcceptanceModel()
    far, near = m.estimate(_chain(20)), m.estimate(_chain(1))
    assert all(f > n for f, n in zip(far[1:], near[1:]))
    # What each run teaches stays with its bucket: failures of short-run chains do not pull
    # long-run ones down to their level.
    for _ in range(30):
        m.update(_chain(1), [0])
        m.update(_chain(20), [0, 1, 2, 3])
    far, near = m.estimate(_chain(20)), m.estimate(_chain(1))
    assert far[3] > 0.7 and near[1] < 0.15
    flat = AcceptanceModel(match_run=False)
    assert flat.estimate(_chain(20)) == flat.estimate(_chain(1))


def test_the_sizer_keeps_more_of_a_chain_whose_match_runs_far_back():
    # Each node costs 30 % of a forward: only a likely one pays.
    curve = CostCurve([1, 2, 4, 8], [100], [[10.0, 13.0, 19.0, 31.0]], {}, "")
    far, near = Sizer(curve).size(_chain(20), 100), Sizer(curve).size(_chain(1), 100)
    assert len(far) == 4 and len(near) < len(far)
    flat = Sizer(curve, match_run=False)
    assert flat.settings["match_run"] is False
    assert len(flat.size(_chain(20), 100)) == len(Sizer(curve, match_run=False).size(_chain(1), 100))


def test_the_largest_tree_follows_the_curve():
    # Flat (a GPU): every measured size; rising (a CPU): where a forward reaches two one-token
    # ones at the shortest context (10 ms + 0.5 ms a node from 8: 28 nodes); steep: the floor.
    flat = CostCurve([1, 64, 128], [16, 512], [[10.0, 10.5, 11.0], [12.0, 13.0, 14.0]], {})
    rising = CostCurve([1, 8, 64], [16, 512], [[10.0, 10.0, 38.0], [14.0, 14.0, 80.0]], {})
    steep = CostCurve([1, 2, 64], [16], [[10.0, 30.0, 500.0]], {})
    assert sizing.largest_tree(flat) == 128
    assert sizing.largest_tree(rising) == 28
    assert sizing.largest_tree(steep) == sizing.MIN_MAX_TREE
    # The sizer keeps no more than that, drafts a pool twice as large, and a setting overrides it.
    s = Sizer(rising)
    assert (s.max_size, s.pool_size) == (28, 56)
    long = DraftTree.root_only(1)
    at = 0
    for tok in range(2, 62):
        at = long.add(at, tok, "lookup", 0, lookup=1, run=20)
    assert len(s.size(long, 16)) == 28
    assert Sizer(rising, max_size=64).pool_size == 128


BF16_KEY = {"dtype": "bfloat16", "device": "cpu", "step_attention": "racer", "kernel": "tiled-abc-rows64"}


def test_the_first_pass_is_priced_only_where_racers_kernels_measured_the_curve():
    assert sizing.first_pass_rows(CostCurve([1, 8], [100], [[10.0, 12.0]], BF16_KEY)) == 8
    # racer's float32 kernel takes 4 rows of x a pass.
    assert sizing.first_pass_rows(CostCurve([1, 8], [100], [[10.0, 12.0]], {**BF16_KEY, "dtype": "float32"})) == 4
    for other in ({**BF16_KEY, "dtype": "float16"}, {**BF16_KEY, "step_attention": "torch"},
                  {**BF16_KEY, "device": "NVIDIA H200"}, {**BF16_KEY, "kernel": "stock"},
                  {**BF16_KEY, "dtype": "float32", "kernel": "packed"}, {}):
        assert sizing.first_pass_rows(CostCurve([1, 8], [100], [[10.0, 12.0]], other)) == 0


def test_first_pass_pricing_lowers_the_small_sizes_and_leaves_the_rest():
    curve = CostCurve([1, 2, 4, 8, 12, 16], [100, 1000], [[10.0, 11.0, 11.5, 12.0, 15.0, 18.0],
                                                          [20.0, 20.1, 22.0, 25.0, 30.0, 36.0]], BF16_KEY)
    priced = sizing.first_pass_priced(curve, 8)
    assert priced.ms[0] == pytest.approx([10.0, 10.2, 10.3, 10.5, 15.0, 18.0])
    assert priced.ms[1] == pytest.approx([20.0, 20.1, 20.6, 21.0, 30.0, 36.0])   # never dearer than measured
    assert curve.ms[0][3] == 12.0 and sizing.first_pass_priced(curve, 0) is curve
    assert priced.t(6, 100) == pytest.approx(10.4) and priced.t(10, 100) == pytest.approx(12.75)


def test_a_sizer_pricing_the_first_pass_keeps_more_of_a_tree_and_judges_disturbance_by_the_measured_curve():
    curve = CostCurve([1, 2, 4, 8, 16], [100], [[10.0, 10.8, 11.4, 13.0, 18.0]], BF16_KEY)
    tree = DraftTree.root_only(1)
    for i in range(3):
        tree.add(0, 10 + i, "logits", i)
    for i in range(12):                  # unlikely siblings (q 0.032 each by the priors)
        tree.add(0, 30 + i, "logits", 4)
    priced, measured = Sizer(curve), Sizer(curve, first_pass=0)
    assert priced.settings["first_pass"] == 8 and measured.settings["first_pass"] == 0
    a, b = priced.plan(tree, 100), measured.plan(tree, 100)
    assert len(a.keep) > len(b.keep)
    assert a.costs[len(a.keep) - 1] < a.curve_ms == pytest.approx(curve.t(len(a.keep), 100))
    assert b.costs[len(b.keep) - 1] == pytest.approx(b.curve_ms)
