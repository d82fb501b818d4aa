"""The shared decode loop on a tiny random model: exactness, limits, cache, sampling."""
import math
import random

import numpy as np
import pytest
import torch
from transformers import DynamicCache

from racer import METHODS, DecodeConfig, DecodeRun, decode, make_drafter
from racer.drafters.base import Drafter
from racer.tree import DraftTree
from racer.verify import Sampling, forward_tree, process_logits
from racer.tiny import tiny_lm

V = 96


@pytest.fixture(scope="module")
def lm():
    return tiny_lm(vocab=V)


def rand_prompt(rng, n=24, alphabet=V):
    # Repeated chunks give the lookup-style drafters something to find.
    chunk = [rng.randrange(alphabet) for _ in range(6)]
    out = []
    while len(out) < n:
        out += chunk if rng.random() < 0.5 else [rng.randrange(alphabet)]
    return out[:n]


def random_tree(rng, root, size, vocab):
    t = DraftTree.root_only(root)
    while len(t) < size:
        p = rng.randrange(len(t))
        t.add(p, rng.randrange(vocab), rng.choice(["retrieval", "logits"]), 0)
    return t


class OracleDrafter(Drafter):
    """Knows the greedy answer and hides it among random distractors, so accepted paths are
    long and their node indices are not contiguous (exercises the cache compaction)."""
    name = "oracle"

    def __init__(self, prompt_len, ref, seed=0):
        self.prompt_len, self.ref, self.rng = prompt_len, ref, random.Random(seed)

    def propose(self, context, root, capacity):
        pos = len(context) - self.prompt_len
        t = DraftTree.root_only(root)
        for _ in range(self.rng.randrange(4)):
            t.add(0, self.rng.randrange(V), "logits", 1)
        node = 0
        for tok in self.ref[pos + 1: pos + 1 + self.rng.randrange(1, 7)]:
            if len(t) >= capacity:
                break
            if self.rng.random() < 0.3 and len(t) < capacity - 1:
                t.add(node, self.rng.randrange(V), "logits", 1)
            node = t.add(node, tok, "retrieval", 0)
        if self.rng.random() < 0.2 and len(t) > 1:  # sometimes a wrong token on the path
            t.add(len(t) - 1, self.rng.randrange(V), "logits", 0)
        return t


def test_tree_logits_equal_sequential(lm):
    rng = random.Random(1)
    prompt = rand_prompt(rng, 12)
    with torch.inference_mode():
        cache = DynamicCache(config=lm.model.config)
        lm.model(input_ids=torch.tensor([prompt]), cache=cache, use_cache=True)
        tree = random_tree(rng, rng.randrange(V), 20, V)
        logits = forward_tree(lm.model, cache, tree, len(prompt), lm.device, lm.dtype)
        assert not tree.is_chain()
        for node in range(len(tree)):
            seq = prompt + [tree.tokens[i] for i in tree.path_to(node)]
            ref = lm.model(input_ids=torch.tensor([seq])).logits[0, -1]
            assert torch.allclose(logits[node], ref, atol=1e-4), node


@pytest.mark.parametrize("seed", range(6))
def test_greedy_every_method_equals_ar(lm, seed):
    rng = random.Random(seed)
    prompt = rand_prompt(rng, rng.randrange(5, 40))
    ref = decode(lm, prompt, make_drafter("ar"), DecodeConfig(max_new_tokens=60)).token_ids
    for method in METHODS:
        for cap in (4, 16, 64):
            out = decode(lm, prompt, make_drafter(method, vocab_size=V), DecodeConfig(max_new_tokens=60, capacity=cap))
            assert out.token_ids == ref, (method, cap)
            assert sum(out.accept_lengths) == len(ref)
    oracle = decode(lm, prompt, OracleDrafter(len(prompt), ref, seed), DecodeConfig(max_new_tokens=60, capacity=12))
    assert oracle.token_ids == ref
    assert oracle.mat > 1.5  # drafts were really accepted, so the check above had teeth


def test_pld_accepts_on_repetitive_text(lm):
    prompt = rand_prompt(random.Random(3), 30)
    res = decode(lm, prompt, make_drafter("pld"), DecodeConfig(max_new_tokens=80, capacity=16))
    assert res.mat > 1.2


@pytest.mark.parametrize("n", [1, 2, 3, 7, 33])
def test_max_new_tokens_exact(lm, n):
    prompt = rand_prompt(random.Random(n), 20)
    for method in ("ar", "pld", "racer", "tr"):
        res = decode(lm, prompt, make_drafter(method, vocab_size=V), DecodeConfig(max_new_tokens=n, capacity=16))
        assert res.new_tokens == n and res.stop_reason == "max_new_tokens", method


def test_eos_stops_and_is_kept(lm):
    prompt = rand_prompt(random.Random(7), 20)
    ref = decode(lm, prompt, make_drafter("ar"), DecodeConfig(max_new_tokens=40)).token_ids
    eos = ref[9]
    lm_eos = tiny_lm(vocab=V, eos=eos)
    expected = ref[: ref.index(eos) + 1]
    for method in ("ar", "pld", "racer", "tr"):
        res = decode(lm_eos, prompt, make_drafter(method, vocab_size=V), DecodeConfig(max_new_tokens=40, capacity=16))
        assert res.token_ids == expected and res.stop_reason == "eos", method
    oracle = decode(lm_eos, prompt, OracleDrafter(len(prompt), ref), DecodeConfig(max_new_tokens=40, capacity=12))
    assert oracle.token_ids == expected


def test_context_limit(lm):
    small = tiny_lm(vocab=V, max_context=40)
    prompt = rand_prompt(random.Random(2), 30)
    res = decode(small, prompt, make_drafter("racer", vocab_size=V), DecodeConfig(max_new_tokens=100, capacity=16))
    assert res.stop_reason == "context_limit"
    assert len(prompt) + res.new_tokens <= 40


def test_cache_holds_exactly_the_committed_tokens(lm):
    prompt = rand_prompt(random.Random(4), 25)
    ref = decode(lm, prompt, make_drafter("ar"), DecodeConfig(max_new_tokens=50)).token_ids
    for drafter in (make_drafter("racer", vocab_size=V), OracleDrafter(len(prompt), ref, 3)):
        run = DecodeRun(lm, prompt, drafter, DecodeConfig(max_new_tokens=50, capacity=12))
        committed = 0
        for step in run:
            committed += len(step.committed)
            if step.forwarded and step.next_root is not None:
                assert run.cache.get_seq_length() == len(prompt) + committed
                assert step.committed == [step.tree.tokens[i] for i in step.accepted]


class Recording(Drafter):
    """Wraps a drafter and records every committed token it is shown."""

    def __init__(self, inner):
        self.inner, self.seen = inner, []
        self.wants_topk, self.wants_topk_p, self.name = inner.wants_topk, inner.wants_topk_p, inner.name

    def start(self, context, new_from, topk, topk_p=None):
        self.inner.start(context, new_from, topk, topk_p)

    def propose(self, context, root, capacity):
        return self.inner.propose(context, root, capacity)

    def observe(self, step):
        self.seen += step.committed
        assert step.committed == [step.tree.tokens[i] for i in step.accepted]
        return self.inner.observe(step)


@pytest.mark.parametrize("n", [1, 2, 5, 9, 13])
def test_drafters_observe_exactly_what_is_output(lm, n):
    """Nothing past an end-of-sequence token or max_new_tokens reaches a drafter, and the last
    committed token does too (a chat's next turn feeds the automaton from there)."""
    prompt = rand_prompt(random.Random(11), 24)
    ref = decode(lm, prompt, make_drafter("ar"), DecodeConfig(max_new_tokens=40)).token_ids
    lm_eos = tiny_lm(vocab=V, eos=ref[7])
    for model in (lm, lm_eos):
        for inner in (OracleDrafter(len(prompt), ref, n), make_drafter("racer", vocab_size=V)):
            spy = Recording(inner)
            res = decode(model, prompt, spy, DecodeConfig(max_new_tokens=n, capacity=12))
            assert spy.seen == res.token_ids, (res.stop_reason, type(inner).__name__)
            if isinstance(inner, OracleDrafter) is False and inner.retrieval:
                assert inner._fed == len(prompt) + res.new_tokens


@pytest.mark.parametrize("n", [1, 2, 3, 8, 9, 17])
def test_mat_is_tokens_per_verification_forward(lm, n):
    """One definition whatever ends the run: plain decoding is exactly 1.0."""
    prompt = rand_prompt(random.Random(n), 20)
    ref = decode(lm, prompt, make_drafter("ar"), DecodeConfig(max_new_tokens=40)).token_ids
    for model in (lm, tiny_lm(vocab=V, eos=ref[min(n, 6)])):
        run = DecodeRun(model, prompt, make_drafter("ar"), DecodeConfig(max_new_tokens=n))
        steps = list(run)
        assert run.result.mat == 1.0 and run.result.forwards == run.result.new_tokens
        assert run.result.forwards == 1 + sum(s.forwarded for s in steps)
        oracle = DecodeRun(model, prompt, OracleDrafter(len(prompt), ref, n), DecodeConfig(max_new_tokens=n, capacity=12))
        steps = list(oracle)
        assert oracle.result.forwards == 1 + sum(s.forwarded for s in steps)
        assert oracle.result.mat == oracle.result.new_tokens / oracle.result.forwards


@pytest.mark.parametrize("field, value, words", [
    ("max_new_tokens", 0, "max_new_tokens must be a whole number >= 1"),
    ("max_new_tokens", 2.5, "max_new_tokens"),
    ("capacity", 0, "capacity must be 'auto'"),
    ("capacity", True, "capacity must be 'auto'"),
    ("capacity", "big", "capacity must be 'auto'"),
    ("temperature", -0.5, "temperature must be >= 0"),
    ("temperature", float("nan"), "temperature must be a finite number"),
    ("top_p", 0.0, "top_p must be in (0, 1]"),
    ("top_p", 1.5, "top_p must be in (0, 1]"),
    ("top_k", -1, "top_k must be a whole number >= 0"),
    ("seed", "x", "seed must be a whole number"),
    ("time_limit_s", 0, "time_limit_s must be > 0"),
])
def test_decode_config_refuses_bad_values(field, value, words):
    with pytest.raises(ValueError) as e:
        DecodeConfig(**{field: value})
    assert words in str(e.value)


def test_bad_input_is_refused(lm):
    with pytest.raises(ValueError):
        DecodeRun(lm, [], make_drafter("ar"))
    with pytest.raises(ValueError):
        DecodeRun(lm, [1, 2], make_drafter("ar"), DecodeConfig(max_new_tokens=0))
    with pytest.raises(ValueError):
        DecodeRun(lm, list(range(90)) * 6, make_drafter("ar"))


def test_top_p_top_k_processing():
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0, -1.0])
    p = process_logits(logits, Sampling(temperature=1.0, top_k=2))
    assert (p[2:] == 0).all() and math.isclose(p.sum().item(), 1.0, rel_tol=1e-6)
    full = torch.softmax(logits, -1)
    p = process_logits(logits, Sampling(temperature=1.0, top_p=0.8))
    keep = int((full.cumsum(0) - full < 0.8).sum())
    assert (p[:keep] > 0).all() and (p[keep:] == 0).all()


# ---- sampling is lossless -------------------------------------------------------------------

SV = 8  # tiny vocabulary so the joint law of two tokens has 64 outcomes


class FullTreeDrafter(Drafter):
    """Every token at depth 1 and one child under each: the first draw always lands in the
    tree and the second often does, so the drafts shape every path."""
    name = "full"

    def propose(self, context, root, capacity):
        t = DraftTree.root_only(root)
        for tok in range(SV):
            t.add(0, tok, "logits", tok)
        for tok in range(SV):
            t.add(1 + tok, (tok * 5 + 1) % SV, "logits", 0)
        return t


def biased_accept(s, gen):
    """A rule that favours drafts: when the draw is not a child, take the first child anyway
    half the time. It is the kind of shortcut the released code makes; the test must catch it."""
    def accept(tree, logits):
        node, path = 0, [0]
        while True:
            draw = int(torch.multinomial(process_logits(logits[node], s), 1, generator=gen).item())
            child = tree.child(node, draw)
            kids = [i for i, p in enumerate(tree.parents) if p == node]
            if child < 0 and kids and torch.rand(1, generator=gen).item() < 0.5:
                child = kids[0]
            if child < 0:
                return path, draw
            node = child
            path.append(node)
    return accept


def chi2_critical(df, z=3.09):
    # Wilson-Hilferty: the 0.999 quantile of chi-square with df degrees of freedom.
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def next_probs(lm, seq, s):
    return process_logits(lm.model(input_ids=torch.tensor([seq])).logits[0, -1], s).double().numpy()


def joint_probs(lm, prompt, s):
    """Exact law of (token 2, token 3): token 1 comes from the prefill, tokens 2 and 3 from the
    tree (the first draw at the root, then one at a depth-1 node), where a bias would show."""
    out = np.zeros((SV, SV))
    with torch.inference_mode():
        p1 = next_probs(lm, prompt, s)
        for a in range(SV):
            p2 = next_probs(lm, prompt + [a], s)
            for b in range(SV):
                if p1[a] * p2[b] > 0:
                    out[b] += p1[a] * p2[b] * next_probs(lm, prompt + [a, b], s)
    return out


def empirical(lm, prompt, s, n, biased=False):
    counts = np.zeros((SV, SV))
    for i in range(n):
        cfg = DecodeConfig(max_new_tokens=3, capacity=64, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                           seed=1000 + i)
        accept = None
        if biased:
            gen = torch.Generator().manual_seed(5000 + i)
            accept = biased_accept(s, gen)
        res = decode(lm, prompt, FullTreeDrafter(), cfg, accept=accept)
        counts[res.token_ids[1], res.token_ids[2]] += 1
    return counts


def chi2(counts, probs):
    n = counts.sum()
    exp = probs * n
    mask = exp > 0
    if counts[~mask].sum() > 0:  # a token outside the processed distribution: certainly biased
        return math.inf, int(mask.sum()) - 1
    return float((((counts - exp) ** 2)[mask] / exp[mask]).sum()), int(mask.sum()) - 1


@pytest.mark.parametrize("s", [Sampling(temperature=1.0, seed=0), Sampling(temperature=0.7, top_p=0.9, seed=0)])
def test_sampling_is_lossless(s):
    lm = tiny_lm(vocab=SV, seed=3)
    with torch.no_grad():
        lm.model.lm_head.weight.mul_(0.15)  # soften: many outcomes with real mass
    prompt = [1, 2, 3, 4, 5]
    probs = joint_probs(lm, prompt, s)
    stat, df = chi2(empirical(lm, prompt, s, 3000), probs)
    assert stat < chi2_critical(df), (stat, df)
    # The same test rejects a biased acceptance rule.
    bad, df = chi2(empirical(lm, prompt, s, 3000, biased=True), probs)
    assert bad > chi2_critical(df), (bad, df)
