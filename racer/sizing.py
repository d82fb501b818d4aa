"""Hardware-aware tree sizing: keep the part of the candidate tree that maximises expected
tokens per second, (1 + sum of P(node accepted)) / (t(T) + overhead).

P(node accepted) = product along its path of q = P(accepted | parent accepted), learned
online per session from what verification accepted, in buckets of what is known when
drafting (source, depth, rank, a lookup chain's match run, the previous step's accepted length,
the model's confidence in the root, retrieval frequency share, border depth), backed off to a
coarser bucket and to priors while data is scarce.

Because P only falls along a path, the best ancestor-closed subset of size k is simply the k
nodes of highest P (ancestors first on ties), so sizing is a sort and a prefix sum.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any, Callable

from .tree import DraftTree

# Priors for q before any data: first-choice rows and retrieval hits are often right,
# lower ranks rarely (the paper: rank-1 copy-logit holds over half of the acceptances).
_PRIOR = {"retrieval": 0.55, "both": 0.65, "lookup": 0.55, "logits": 0.40, "template": 0.35}
_RANK_PRIOR = (1.0, 0.35, 0.2, 0.12, 0.08)
_DEEP_COPY = 0.85
#: The prior q of a prompt-lookup chain node by how far its match agrees backwards
#: (`run_bucket`) and its depth (1, 2, 3+): a chain whose match runs back 16 tokens is a
#: passage being copied, one that matched 1-2 tokens is a guess. Measured on the shipped prompts
#: (40 turns, 256 tokens, bfloat16: scripts/draft_diagnosis.py --data assets/bench_prompts.jsonl
#: --per-category 5): 0.32/0.60/0.77 for runs of 1-2 tokens up to 0.96/0.96/0.99 for 16+
#: (docs/PERFORMANCE.md §4, "The chain's match run").
_RUN_PRIOR = ((0.3, 0.6, 0.75), (0.6, 0.7, 0.85), (0.8, 0.8, 0.8), (0.8, 0.85, 0.95), (0.95, 0.95, 0.99))
#: Buckets of a copy-logit entry's probability in its row (upper edges), and the prior q of
#: each. The row was computed in another context, so q sits well below the probability:
#: measured on the shipped prompts (racer, capacity 40, 128 tokens, 2,000 logits nodes whose
#: parent was accepted) q was 0.01-0.02 below 0.05, 0.04-0.08 in 0.05-0.2, 0.16-0.26 in
#: 0.2-0.5, and only 0.34-0.35 above 0.5 (docs/PERFORMANCE.md, "Sizing").
_P_EDGES = (0.05, 0.2, 0.5, 0.8)
_P_PRIOR = (0.015, 0.06, 0.2, 0.3, 0.35)
#: The prior q of a cold row's entry by rank (racer.coldrows; measured there: 17.8 % of the
#: roots without a row continued with its first entry, 7 % with its second, 4-5 % with the 3rd-4th).
_COLD_PRIOR = (0.18, 0.08, 0.05, 0.04, 0.03)
#: A node this unlikely to be accepted is never worth its place in a verified tree: on the 2-core
#: CPUs a node costs 1-4 % of a forward, so it must add about 0.02 expected tokens to pay; even on a
#: GPU, where nodes are nearly free, a thousand of them would add less than one token. Its children are
#: not estimated (`AcceptanceModel.estimate`).
NEGLIGIBLE = 1e-3
#: A first-level copy-logit node whose token the root's cold row also ranks in its top 3: two
#: views of the same root agreeing (measured on Spec-Bench, 2 per category: such nodes at rank 1
#: were accepted given their parent at 0.20 where sizing had put them at 0.09).
_AGREE_PRIOR = (0.45, 0.2, 0.12, 0.07, 0.05)


#: Buckets (upper edges) of the model's confidence in the root: its top-1 probability at the node
#: whose prediction the root is. Predictability comes in stretches, so a confident root says the
#: drafts below it are likelier to hold. Measured on Spec-Bench (2 per category, 256 tokens,
#: bfloat16, 2,155 steps), the pool's accepted draft tokens per step rose from 1.3 below 0.3 to
#: 4.0 above 0.99, and within one bucket of the previous step's accepted length by up to 6x
#: (docs/PERFORMANCE.md §4.1, "The root's confidence").
_CONF_EDGES = (0.3, 0.6, 0.9)


def conf_bucket(p: float | None) -> int:
    """0..3 by the model's top-1 probability where it fixed the root; -1 when unknown."""
    if p is None or not p >= 0:
        return -1
    for b, edge in enumerate(_CONF_EDGES):
        if p < edge:
            return b
    return len(_CONF_EDGES)


def p_bucket(p: float | None) -> int:
    """0..4 by a copy-logit entry's probability; -1 when unknown."""
    if p is None or p < 0:
        return -1
    for b, edge in enumerate(_P_EDGES):
        if p < edge:
            return b
    return len(_P_EDGES)


@lru_cache(maxsize=None)  # called for every candidate node at every step; few distinct keys
def _prior(source: str, rank: int, depth: int = 1, burst: int = 0, pb: int = -1, rb: int = -1) -> float:
    if source == "cold":
        return _COLD_PRIOR[min(rank, len(_COLD_PRIOR) - 1)]
    if source == "agree":
        return _AGREE_PRIOR[min(rank, len(_AGREE_PRIOR) - 1)]
    # "retrieval+lookup" etc.: a node two sources proposed is at least as likely as either's.
    base = max(_PRIOR.get(s, 0.3) for s in source.split("+"))
    if rb >= 0:
        return max(base if source != "lookup" else 0.0, _RUN_PRIOR[rb][min(depth, 3) - 1])
    if source in ("logits", "template"):
        if pb >= 0:
            return _P_PRIOR[pb]
        return base * _RANK_PRIOR[min(rank, len(_RANK_PRIOR) - 1)]
    if burst < 2:
        return base
    # Inside a copying stretch (the last step accepted 2+ drafts), once the first tokens of a
    # copy are accepted the next one usually is too: given its parent, q rises with depth.
    return base + (_DEEP_COPY - base) * (1.0 - 1.0 / depth)


@dataclass
class AcceptanceModel:
    """Beta-style counts per bucket with back-off: each bucket's estimate shrinks towards its
    coarser parent's, the coarsest towards the prior. Buckets, coarse to fine: (source, depth,
    rank, the chain's match run); + burst, the bucketed accepted length of the previous step
    (acceptance comes in runs: copying stretches and free text), the bucketed probability
    of a copy-logit entry in its row and the bucketed confidence of the model in the root
    (`conf_bucket`, -1 when not used); + retrieval frequency share and border depth."""
    #: Pseudo-counts of each level's parent estimate, coarse to fine.
    weights: tuple[float, ...] = (4.0, 4.0, 4.0)
    counts: dict[tuple, list[float]] = field(default_factory=dict)
    #: Tell prompt-lookup chain nodes apart by how far their match agrees backwards.
    match_run: bool = True
    #: Tell apart first-level copy-logit nodes that the root's cold row also ranks high.
    agree: bool = True

    def features(self, tree: DraftTree, node: int, sibling_freq: dict[int, int], burst: int = 0,
                 conf: int = -1) -> tuple[tuple, ...]:
        """Bucket keys from coarse to fine; each refines the one before it."""
        fine = self._key(tree, node, sibling_freq, burst, conf)
        return fine[:4], fine[:7], fine

    def _key(self, tree: DraftTree, node: int, sibling_freq: dict[int, int], burst: int, conf: int) -> tuple:
        """The finest bucket key: (source, depth, rank, run bucket) + (burst, probability bucket,
        confidence) + (frequency share, border depth); `features` cuts the coarser ones from it."""
        src = tree.sources[node]
        meta = tree.meta[node] if tree.meta else None
        d, r = tree.depths[node], tree.ranks[node]
        if not meta:  # most of a pool's copy-logit nodes carry only a probability; roots none
            return (src, d if d < 6 else 6, r if r < 4 else 4, -1, burst, -1, conf, -1, -1)
        get = meta.get
        if get("lookup") and src != "lookup":  # also on racer's prompt-lookup chain
            src += "+lookup"
        elif get("cold"):  # from a cold row (racer.coldrows), not a row of this context
            src = "cold"
        elif self.agree and get("agree") and src == "logits":
            src = "agree"
        share_b = bd_b = -1
        freq = get("freq")
        if freq is not None:
            total = sibling_freq.get(tree.parents[node], 0) or 1
            share_b = min(int(4 * freq / total), 3)
            bd_b = min(int(get("border_depth", 0)), 8) // 2
        return (src, d if d < 6 else 6, r if r < 4 else 4, run_bucket(get("run")) if self.match_run else -1,
                burst, p_bucket(get("p_row")), conf, share_b, bd_b)

    def _sibling_freq(self, tree: DraftTree) -> dict[int, int]:
        out: dict[int, int] = {}
        if not tree.meta:
            return out
        parents = tree.parents
        for i, m in enumerate(tree.meta):
            f = m.get("freq") if i else None
            if f:
                out[parents[i]] = out.get(parents[i], 0) + f
        return out

    def _q(self, fine: tuple) -> float:
        """q for the finest key `fine` (`_key`): the prior shrunk by each level's counts, coarse to fine."""
        src, depth, rank, rb, burst, pb = fine[:6]
        q = _prior(src, rank, depth, burst, pb, rb)
        get, none = self.counts.get, (0.0, 0.0)
        for key, weight in zip((fine[:4], fine[:7], fine), self.weights):
            a, n = get(key, none)
            q = (a + weight * q) / (n + weight)
        return q

    def estimate(self, tree: DraftTree, burst: int = 0, conf: int = -1) -> list[float]:
        """P(node accepted) for every node (root = 1). Below a node whose P is under `NEGLIGIBLE`
        the descendants get 0 without being looked at (P only falls along a path): on a CPU they
        never pay for their place, and the deep copy-logit nodes that fill most of a pool are such."""
        sib = self._sibling_freq(tree)
        p = [1.0] * len(tree)
        parents = tree.parents
        key, q_of = self._key, self._q
        # Nodes of one bucket share their q within a step (the ~42 nodes estimated in a pool of 48
        # fall in ~23 buckets), and this runs before every forward.
        memo: dict[tuple, float] = {}
        for i in range(1, len(tree)):
            up = p[parents[i]]
            if up < NEGLIGIBLE:
                p[i] = 0.0
                continue
            fine = key(tree, i, sib, burst, conf)
            q = memo.get(fine)
            if q is None:
                q = memo[fine] = q_of(fine)
            p[i] = up * q
        return p

    def update(self, tree: DraftTree, accepted: list[int], burst: int = 0, conf: int = -1) -> None:
        """Every child of an accepted node was tried; it succeeded if it is on the path."""
        on_path = set(accepted)
        sib = self._sibling_freq(tree)
        for i in range(1, len(tree)):
            if tree.parents[i] not in on_path:
                continue
            hit = 1.0 if i in on_path else 0.0
            for key in self.features(tree, i, sib, burst, conf):
                c = self.counts.setdefault(key, [0.0, 0.0])
                c[0] += hit
                c[1] += 1.0


def rank_by_chance(probs: list[float]) -> list[int]:
    """Candidate nodes (the root left out), most likely to be accepted first (ties: earlier node)."""
    # A stable sort keeps equal chances in node order, descending too (`reverse` keeps stability).
    return sorted(range(1, len(probs)), key=probs.__getitem__, reverse=True)


def choose_size(probs: list[float], cost_ms: Callable[[int], float], overhead_ms: float = 0.0,
                max_size: int | None = None) -> tuple[list[int], float, list[float]]:
    """Nodes to keep (ancestor-closed, root included), their expected committed tokens, and
    the expected tokens/ms for every size 1..n (for the cost-curve picture)."""
    keep, expected, rates, _ = _choose(probs, rank_by_chance(probs), cost_ms, overhead_ms, max_size)
    return keep, expected, rates


def _choose(probs: list[float], ranked: list[int], cost_ms: Callable[[int], float], overhead_ms: float,
            max_size: int | None) -> tuple[list[int], float, list[float], list[float]]:
    """`choose_size` on candidates already ranked (`rank_by_chance`); also returns E(T), the
    expected committed tokens with the T most likely nodes, for T = 1..n."""
    n = len(probs) if max_size is None else min(len(probs), max_size)
    order = ranked[: n - 1]
    best_k, best_rate, expected = 0, -1.0, 1.0
    rates = []
    by_size = []
    running = 1.0
    for k in range(0, len(order) + 1):
        if k:
            running += probs[order[k - 1]]
        by_size.append(running)
        rate = running / (cost_ms(k + 1) + overhead_ms)
        rates.append(rate)
        if rate > best_rate:
            best_k, best_rate, expected = k, rate, running
    keep = sorted([0] + order[:best_k])
    return keep, expected, rates, by_size


def prune(tree: DraftTree, keep: list[int], probs: list[float] | None = None) -> DraftTree:
    """The sub-tree on `keep` (sorted, ancestor-closed), in the original order."""
    if len(keep) == len(tree):
        out = tree
    else:
        # Lists taken whole rather than node by node through `add`: this runs before every forward.
        remap = {old: new for new, old in enumerate(keep)}
        tokens, parents = [tree.tokens[i] for i in keep], [remap.get(tree.parents[i], -1) for i in keep]
        if keep[0] != 0 or any(not 0 <= p < i for i, p in enumerate(parents) if i):
            raise ValueError("prune: `keep` must be sorted, start at the root and hold every kept node's parent")
        out = DraftTree.from_lists(tokens, parents, [tree.sources[i] for i in keep], [tree.ranks[i] for i in keep],
                                   [tree.depths[i] for i in keep],
                                   [dict(tree.meta[i]) for i in keep] if tree.meta else [{} for _ in keep],
                                   dict(tree.info))
    if probs is not None:
        for new, old in enumerate(keep):
            out.meta[new]["p_accept"] = round(probs[old], 4)
    return out


def run_bucket(run: int | None) -> int:
    """-1 (not on the prompt-lookup chain), then 0..4 by how far its match agrees backwards:
    1-2, 3, 4-7, 8-15, 16+ tokens."""
    if not run:
        return -1
    return 0 if run <= 2 else 1 if run == 3 else 2 if run < 8 else 3 if run < 16 else 4


def burst_bucket(accepted_drafts: int) -> int:
    """0, 1, 2-3, 4+ draft tokens accepted in a step."""
    return 0 if accepted_drafts <= 0 else 1 if accepted_drafts == 1 else 2 if accepted_drafts <= 3 else 3


#: A forward that took this many times the cost curve's time for its tree size and context was
#: disturbed: the machine was busy (another process, another visitor's page), and its time says
#: nothing about the tree. Measured on the 2-core CPUs: real tree forwards run 0.9-1.4x the
#: curve on a quiet machine, 2.5-5x beside a busy process.
DISTURBED = 1.5


def disturbed(measured_ms: float, predicted_ms: float | None) -> bool:
    """Whether a forward that took `measured_ms` against the curve's `predicted_ms` was disturbed."""
    return bool(predicted_ms) and measured_ms > DISTURBED * predicted_ms


#: Whether sizers calibrate the cost curve against their own forwards by default. Off: on the
#: shipped prompts (AVX512-BF16, bfloat16, 256 tokens, one interleaved run of
#: `racer@auto-cal,racer@auto-nocal`) calibrating gave 1.82x `ar` against 1.78x without (the
#: Spec-Bench mean 1.97x against 1.96x), within that run's noise, while it makes every
#: decoding's trees follow its own forwards' jitter: "Extract to JSON" drafted 7.2-7.7 nodes a
#: step and accepted 4.00-4.27 tokens per forward over three quiet runs, against 9.5 and 5.33 in
#: every run without (scripts/sizing_jitter.py; docs/PERFORMANCE.md §4 and §8).
CALIBRATE = False


class ForwardCalibration:
    """How the verify forwards of this decoding compare with the cost curve, per tree size.

    The curve is measured once, on random trees in a quiet loop; inside real decoding the
    forwards differ (measured on a 2-core AVX2 CPU: T=1 ran ~15 % under the curve and T=4..8 ~5 %
    over it, so the curve made trees look cheaper than they were and sizing over-drafted).
    Each step's forward time updates a moving average of observed/predicted for its size;
    a size not seen yet borrows the ratio of the nearest smaller size that was (the cost of
    a larger tree is never assumed to drop below what is known), else 1."""

    def __init__(self, alpha: float = 0.05, min_count: int = 3) -> None:
        self.alpha, self.min_count = alpha, min_count
        self.ratio: dict[int, float] = {}
        self.count: dict[int, int] = {}

    @staticmethod
    def bucket(size: int) -> int:
        # Sizes up to 16 are chosen often and kept apart; above, powers of two share a ratio.
        return size if size <= 16 else 1 << (size - 1).bit_length()

    def observe(self, size: int, observed_ms: float, predicted_ms: float) -> None:
        if predicted_ms <= 0 or observed_ms <= 0:
            return
        b = self.bucket(size)
        r = observed_ms / predicted_ms
        n = self.count.get(b, 0)
        # Plain mean over the first observations, then a moving average.
        a = max(self.alpha, 1.0 / (n + 1))
        self.ratio[b] = r if n == 0 else (1 - a) * self.ratio[b] + a * r
        self.count[b] = n + 1

    def factor(self, size: int) -> float:
        return self.factors(size)[-1]

    def factors(self, n: int) -> list[float]:
        """The scale of the curve's cost for T = 1..n, in one pass."""
        ready = sorted(k for k, c in self.count.items() if c >= self.min_count)
        out, i, f = [], 0, 1.0
        for T in range(1, n + 1):
            b = self.bucket(T)
            while i < len(ready) and ready[i] <= b:
                f = self.ratio[ready[i]]
                i += 1
            out.append(f)
        return out


@dataclass
class SizePlan:
    """Sizing's decision for one candidate tree (`Sizer.plan`)."""
    keep: list[int]                 # node indices kept, ancestor-closed, root included
    expected: float                 # expected committed tokens per step with them: E(len(keep))
    rates: list[float]              # expected tokens per ms for T = 1..n
    costs: list[float]              # the forward ms assumed for T = 1..n (calibrated curve)
    probs: list[float]              # P(node accepted), every candidate
    expected_by_size: list[float]   # E(T) for T = 1..n
    explore: bool                   # kept for exploration rather than for speed
    curve_ms: float                 # the uncalibrated curve's ms at the kept size


#: The largest tree sizing keeps, unless told: the largest size whose forward the cost curve puts
#: at no more than this many one-token forwards (at its shortest context). A flat GPU curve allows
#: every measured size; a CPU's curve stops it where the products turn compute-bound. Larger trees
#: are hardly ever chosen on a CPU, yet the pool (twice the largest tree) was built and judged at
#: every step: on Spec-Bench (1 per category, 256 tokens, bfloat16, AVX512-BF16) 4.7 % of the
#: steps kept 17-24 nodes and none more; on Spec-Bench, 10 per category, this cap (24) against 64
#: drafted in 0.28 ms a step instead of 0.41 at the same MAT, 1.7 % faster
#: (docs/PERFORMANCE.md §4, "The largest tree").
MAX_TREE_COST = 2.0
#: ... and never fewer than this many nodes, so a steep curve still leaves room for a short chain and
#: for exploration's few nodes.
MIN_MAX_TREE = 8


#: Rows one pass of racer's bfloat16 linear kernel takes (racer.cpu.linear: 8 rows of x per pass
#: over a weight tile). Trees up to this size stream the weights once.
FIRST_PASS_ROWS = 8
#: The same for racer's float32 (AVX2) kernel, which runs the rows of x 4 at a time against each
#: block of weights (csrc/tiled_linear.cpp). Priced like the bfloat16 pass, on Spec-Bench (3 and 5
#: per category, 256 tokens) and the shipped prompts, interleaved per question against the curve
#: as measured: 1.005-1.013x tokens/s, 1.013-1.017x by the median question (docs/PERFORMANCE.md §4,
#: "The first pass").
FIRST_PASS_ROWS_F32 = 4
#: What sizing charges a tree of 2 <= T <= the first pass's rows, at most, is t(1) times
#: _FIRST_PASS_BASE + _FIRST_PASS_SLOPE * T (1.02 at 2, 1.03 at 4, 1.05 at 8). The quiet-loop
#: curve's low end read 1.05-1.19 t(1) at 8 nodes in runs on the same machine hours apart, and the low-probability
#: nodes these sizes admit are accepted more often than sizing predicts (docs/PERFORMANCE.md §4.1,
#: "How well sizing's P(node accepted) holds"). Priced this way the sizer kept about one more node
#: a step: on Spec-Bench, 5 per category, MAT 2.611 against 2.542 and 1.038x the tokens/s of the
#: measured curve (interleaved per question; docs/PERFORMANCE.md §4, "The first pass").
_FIRST_PASS_BASE, _FIRST_PASS_SLOPE = 1.01, 0.005


def first_pass_rows(curve: Any) -> int:
    """The rows of one pass of racer's linear kernel where `curve` was measured with racer's
    kernels on a CPU (FIRST_PASS_ROWS in bfloat16, FIRST_PASS_ROWS_F32 in float32), else 0 (the
    curve as measured)."""
    key = getattr(curve, "key", None) or {}
    racer_kernels = (key.get("device") == "cpu" and key.get("step_attention") == "racer"
                     and str(key.get("kernel", "")).startswith("tiled"))
    if not racer_kernels:
        return 0
    return {"bfloat16": FIRST_PASS_ROWS, "float32": FIRST_PASS_ROWS_F32}.get(key.get("dtype"), 0)


def first_pass_priced(curve: Any, rows: int) -> Any:
    """A copy of `curve` whose grid sizes 2..`rows` cost at most the first-pass price (above)
    at each context (sizes between grid points interpolate as before); `curve` itself when `rows`
    is 0."""
    if not rows:
        return curve
    ms = [[min(t, row[0] * (_FIRST_PASS_BASE + _FIRST_PASS_SLOPE * size)) if 2 <= size <= rows else t
           for size, t in zip(curve.sizes, row)] for row in curve.ms]
    return replace(curve, ms=ms)


def largest_tree(curve: Any) -> int:
    """The largest tree a sizer keeps on `curve` (`MAX_TREE_COST`, at least `MIN_MAX_TREE`)."""
    ts = curve.ts(max(curve.sizes), curve.contexts[0])
    fits = [T for T, t in enumerate(ts, 1) if t <= MAX_TREE_COST * ts[0]]
    return max(MIN_MAX_TREE, max(fits, default=1))


class Sizer:
    """Per-session sizing state: the acceptance model, the per-step overhead estimate and (with
    `calibrate`) the calibration of the cost curve against this decoding's own forwards."""

    def __init__(self, curve: Any, max_size: int | None = None, pool_factor: int = 2, burst: bool = True,
                 skip_disturbed: bool = True, calibrate: bool = CALIBRATE, match_run: bool = True,
                 confidence: bool = True, first_pass: int | None = None) -> None:
        """`skip_disturbed`: learn the calibration and the overhead only from steps whose forward
        was not `disturbed`. Without it a busy machine shrinks the trees (beside a busy-loop
        process on one of two cores, "Extract to JSON" drafted 4.7-5.2 nodes a step instead of
        8.8 and accepted 3.05-3.20 tokens per forward instead of 5.12: scripts/sizing_jitter.py
        --busy), so a race under load measured another method than a quiet one
        (docs/PERFORMANCE.md, "The race's clock").
        `calibrate`: scale the curve by this decoding's own forwards (`ForwardCalibration`).
        `match_run`: learn and judge a prompt-lookup chain by how far its match agrees backwards
        (`run_bucket`); off, every chain node of a depth and rank shares one estimate.
        `confidence`: learn and judge every node by the model's confidence in the root
        (`conf_bucket`: the top-1 probability where the last forward fixed it, which `observe`
        reads from the step's top-k probabilities); off, or where the step has none, one bucket.
        `first_pass`: price trees of up to this many nodes by `first_pass_priced` (None: from the
        curve, `first_pass_rows`; 0: the curve as measured). The measured curve still judges
        whether a forward was disturbed."""
        self.curve = curve
        first_pass = first_pass_rows(curve) if first_pass is None else int(first_pass)
        self.priced = first_pass_priced(curve, first_pass)
        #: The arguments besides the curve, so a replay makes the same sizer (racer.replay).
        self.settings = {"max_size": max_size, "pool_factor": pool_factor, "burst": burst,
                         "skip_disturbed": skip_disturbed, "calibrate": calibrate, "match_run": match_run,
                         "confidence": confidence, "first_pass": first_pass}
        self.skip_disturbed, self.calibrate = skip_disturbed, calibrate
        self.max_size = max_size or largest_tree(curve)
        # Drafters propose a larger pool than can be verified, so that learned acceptance (not
        # the drafter's fixed order, e.g. retrieval before logits) decides what fills the tree.
        self.pool_size = self.max_size * max(1, pool_factor)
        self.model = AcceptanceModel(match_run=match_run)
        self.overhead_ms = 1.0  # draft + acceptance + cache + update; tracked as a moving average
        # Without drafts nothing is learned: a drafter sized to zero by pessimistic priors would
        # stay there. Every `explore_every`-th undrafted step verifies the top few candidates.
        self.explore_every, self.explore_nodes = 16, 4
        self._idle = 0
        self.use_burst = burst
        self.burst = 0  # bucket of the previous step's accepted draft length
        self.use_confidence = confidence
        self.conf = -1  # bucket of the model's confidence in the next root (-1: unknown)
        self.calibration = ForwardCalibration()
        self._predicted: tuple[int, float] | None = None

    def plan(self, tree: DraftTree, context_len: int) -> SizePlan:
        """What `size` would keep of `tree` now, and why; changes nothing (the step inspector
        asks it about trees the run never drafted)."""
        probs = self.model.estimate(tree, self.burst, self.conf)
        # Every size sizing may choose, exploration's included.
        n = min(len(tree), max(self.max_size, self.explore_nodes + 1))
        curve = self.curve.ts(n, context_len)
        priced = curve if self.priced is self.curve else self.priced.ts(n, context_len)
        # Predicted verify-forward ms: the (priced) cost curve scaled by this decoding's calibration.
        costs = [c * f for c, f in zip(priced, self.calibration.factors(n))] if self.calibration.count else priced
        # One ranking serves the choice, the exploration and E(T) (this runs at every step).
        ranked = rank_by_chance(probs)
        keep, expected, rates, by_size = _choose(probs, ranked, lambda T: costs[T - 1], self.overhead_ms,
                                                 self.max_size)
        explore = False
        if len(keep) == 1 and len(tree) > 1 and self._idle + 1 >= self.explore_every:
            explore = True
            top = ranked[: self.explore_nodes]
            keep = sorted({0, *top})
            expected = 1.0 + sum(probs[i] for i in top)
        return SizePlan(keep, expected, rates, costs[:len(rates)], probs, by_size, explore, curve[len(keep) - 1])

    def size(self, tree: DraftTree, context_len: int) -> DraftTree:
        plan = self.plan(tree, context_len)
        # Without drafts nothing is learned: count the undrafted steps until an exploration.
        self._idle = self._idle + 1 if len(plan.keep) == 1 and len(tree) > 1 else 0
        out = prune(tree, plan.keep, plan.probs)
        self._predicted = (len(plan.keep), plan.curve_ms)
        out.info.update({"chosen_T": len(plan.keep), "candidates": len(tree), "expected_accept": round(plan.expected, 4),
                         "explore": plan.explore, "burst": self.burst, "conf": self.conf,
                         "rates": [round(r * 1e3, 3) for r in plan.rates],
                         "expected_by_size": [round(e, 4) for e in plan.expected_by_size],
                         # The forward ms sizing assumed (the curve after calibration), per size.
                         "cost_ms": [round(c, 2) for c in plan.costs]})
        return out

    def observe(self, tree: DraftTree, accepted: list[int], timings: dict[str, float],
                topk_p: Any = None) -> None:
        """Learn from a verified step: `accepted` is its whole accepted path (before any commit
        limit), `topk_p` the model's top-k probabilities at its nodes (None: not known)."""
        self.model.update(tree, accepted, self.burst, self.conf)
        if self.use_burst:
            self.burst = burst_bucket(len(accepted) - 1)
        if self.use_confidence:
            # The next root is the model's choice at the last accepted node.
            self.conf = conf_bucket(float(topk_p[accepted[-1]][0])) if topk_p is not None and len(topk_p) else -1
        predicted, self._predicted = self._predicted, None
        sized = predicted is not None and "forward_ms" in timings and predicted[0] == len(tree)
        if self.skip_disturbed and sized and disturbed(timings["forward_ms"], predicted[1]):
            return  # the machine was busy: its times would teach the load, not the trees' cost
        # The picture data a page asks for is not the method's work (the race does not charge it).
        over = sum(v for k, v in timings.items() if k not in ("forward_ms", "picture_ms"))
        self.overhead_ms = 0.9 * self.overhead_ms + 0.1 * over
        if sized and self.calibrate:
            self.calibration.observe(len(tree), timings["forward_ms"], predicted[1])
