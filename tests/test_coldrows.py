"""Cold rows (racer.coldrows): every row is the model's top-K after the opener and that token
alone, they are cached per model, a root without a copy-logit row drafts from its cold row (and
only such a root), sizing learns those nodes apart, decoding with them stays lossless, and a
run drafted with them replays only with them."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from racer import DecodeConfig, DecodeRun, decode, make_drafter
from racer.coldrows import ColdRows, compute, get_cold_rows, load, opener, rows_key
from racer.copylogit import CopyLogitStore
from racer.records import StartRecord
from racer.replay import Replay, ReplayError, Turn
from racer.sizing import AcceptanceModel
from racer.tiny import tiny_lm

V = 96
PROMPT = [5, 6, 7, 8, 9, 10, 5, 6, 7, 8, 11, 12, 5, 6, 7, 8, 9, 10, 13, 14, 5, 6, 7]


@pytest.fixture(scope="module")
def lm():
    return tiny_lm(vocab=V, seed=3, max_context=1024)


def test_every_row_is_the_top_k_after_the_opener_and_the_token(lm, own_cache):
    rows = compute(lm, batch=40)          # batches of 40: the last one is short
    pre = opener(lm)
    assert rows.tokens.shape == (V, 8) and rows.probs.shape == (V, 8) and pre == [0]
    with torch.inference_mode():
        x = torch.tensor([pre + [t] for t in range(V)])
        logits = lm.model(input_ids=x).logits[:, -1].float()
    p = logits.softmax(-1)
    for t in range(V):
        # The same distribution, read through the shared prefix's cache: the same ids in the same
        # order, and their probabilities; a near tie may swap two neighbours' order only.
        got = rows.tokens[t].tolist()
        np.testing.assert_allclose(p[t, got].numpy(), rows.probs[t], rtol=1e-4, atol=1e-6)
        assert sorted(got) == sorted(p[t].topk(8).indices.tolist()) or \
            float(p[t].topk(9).values[7] - p[t].topk(9).values[8]) < 1e-5
        assert np.all(np.diff(rows.probs[t]) <= 1e-6)


def test_rows_are_cached_per_model_and_read_back(lm, own_cache):
    lm.cold_rows = None
    first = get_cold_rows(lm)
    assert lm.cold_rows is first and first.key == rows_key(lm)
    again = load(rows_key(lm))
    assert again is not None and np.array_equal(again.tokens, first.tokens) and np.array_equal(again.probs, first.probs)
    assert load(dict(rows_key(lm), model="another")) is None
    lm.cold_rows = None
    assert np.array_equal(get_cold_rows(lm).tokens, first.tokens)


def cold(tokens: list[list[int]]) -> ColdRows:
    t = np.array(tokens, dtype=np.int32)
    return ColdRows(t, np.full(t.shape, 0.5, dtype=np.float32), {})


def test_only_a_root_without_a_row_expands_its_cold_row():
    store = CopyLogitStore(8, k=2)
    store.cold = cold([[1, 2], [3, 4], [5, 6], [7, 1], [2, 3], [4, 5], [6, 7], [1, 3]])
    store.write([1], np.array([[4, 5]]), np.array([[0.9, 0.05]]))
    seen = store.expand(1, 10)             # a real row: the cold one is not read
    assert not seen.cold and seen.tokens[:2] == [4, 5] and seen.probs[:2] == pytest.approx([0.9, 0.05])
    novel = store.expand(0, 10)            # no row: its cold row, and below it the real rows only
    assert novel.cold and novel.tokens == [1, 2, 4, 5] and novel.parents == [-1, -1, 0, 0]
    assert novel.probs[:2] == [0.5, 0.5]
    store.cold = None
    assert len(store.expand(0, 10)) == 0


def test_racer_drafts_a_novel_root_from_its_cold_row_and_sizing_learns_it_apart(lm):
    rows = cold([[(t + 1) % V, (t + 2) % V] + [-1] * 6 for t in range(V)])
    with_rows = make_drafter("racer", vocab_size=V)
    without = make_drafter("racer-nocold", vocab_size=V)
    assert with_rows.wants_cold_rows and not without.wants_cold_rows
    assert not make_drafter("racer-nochain", vocab_size=V).wants_cold_rows   # the paper's drafter
    for d in (with_rows, without):
        d.use_cold_rows(rows)
        d.start(PROMPT, 0, np.tile(np.arange(8), (len(PROMPT), 1)))
    novel = 50
    tree = with_rows.propose(PROMPT, novel, 8)
    assert tree.tokens[1:3] == [51, 52] and all(tree.meta[i].get("cold") == 1 for i in (1, 2))
    assert tree.info["cold_root"] and len(without.propose(PROMPT, novel, 8)) == 1
    # A root the prompt fed keeps its real row.
    seen = with_rows.propose(PROMPT, 5, 8)
    assert not seen.info["cold_root"] and not any(m.get("cold") for m in seen.meta)
    model = AcceptanceModel()
    assert model.features(tree, 1, {})[0][0] == "cold"
    before = model.estimate(tree)[1]
    model.update(tree, [0, 1])             # its first entry held
    assert model.estimate(tree)[1] > before


def test_a_copy_logit_entry_the_cold_row_also_ranks_high_is_marked_and_sized_apart(lm):
    # Every fed token's real row is 0..7; every cold row ranks 3, 2, 90 first.
    rows = cold([[3, 2, 90, 4, 5, -1, -1, -1] for _ in range(V)])
    marked = make_drafter("racer", vocab_size=V, lookup_chain=False)
    plain = make_drafter("racer", vocab_size=V, lookup_chain=False, cold_agree=False)
    for d in (marked, plain):
        d.use_cold_rows(rows)
        d.start(PROMPT, 0, np.tile(np.arange(8), (len(PROMPT), 1)))
    tree = marked.propose(PROMPT, 13, 16)
    first = {tree.tokens[i]: i for i in range(1, len(tree)) if tree.parents[i] == 0 and tree.sources[i] == "logits"}
    assert {2, 3, 4} <= set(first)
    assert {t for t, i in first.items() if tree.meta[i].get("agree")} == {2, 3}   # top 3 only; 4 is ranked 4th
    assert not any(m.get("agree") for i, m in enumerate(tree.meta) if i and tree.parents[i] != 0)
    untouched = plain.propose(PROMPT, 13, 16)
    assert not any(m.get("agree") for m in untouched.meta)
    model, blind = AcceptanceModel(), AcceptanceModel(agree=False)
    assert model.features(tree, first[3], {})[0][0] == "agree"
    assert model.features(tree, first[4], {})[0][0] == "logits"
    assert blind.features(tree, first[3], {})[0][0] == "logits"
    # Agreement is read as likelier than the same rank alone, and learnt apart from it.
    est = model.estimate(tree)
    assert est[first[3]] > blind.estimate(tree)[first[3]]
    model.update(tree, [0, first[2]])
    assert model.estimate(tree)[first[2]] > est[first[2]]


@pytest.mark.parametrize("capacity", ["auto", 12])
def test_decoding_with_cold_rows_is_lossless_and_uses_them(lm, own_cache, capacity):
    lm.cold_rows = None
    plain = decode(lm, PROMPT, make_drafter("ar", vocab_size=V), DecodeConfig(max_new_tokens=60, capacity=1))
    get_cold_rows(lm)
    run = DecodeRun(lm, PROMPT, make_drafter("racer", vocab_size=V), DecodeConfig(max_new_tokens=60, capacity=capacity))
    steps = list(run)
    assert run.result.token_ids == plain.token_ids
    assert any(s.tree.info.get("cold_root") for s in steps if s.forwarded)
    # Without the rows handed over, the same drafter drafts nothing at those roots.
    lm.cold_rows = None
    run2 = DecodeRun(lm, PROMPT, make_drafter("racer", vocab_size=V), DecodeConfig(max_new_tokens=60, capacity=capacity))
    steps2 = list(run2)
    assert run2.result.token_ids == plain.token_ids
    assert not any(s.tree.info.get("cold_root") for s in steps2)


def test_a_run_with_cold_rows_replays_only_with_them(lm, own_cache):
    rows = get_cold_rows(lm)
    run = DecodeRun(lm, PROMPT, make_drafter("racer", vocab_size=V), DecodeConfig(max_new_tokens=48, capacity=12))
    steps = list(run)
    assert any(s.tree.info.get("cold_root") and len(s.tree) > 1 for s in steps)
    assert run.start.cold_rows and StartRecord.from_dict(run.start.to_dict()).cold_rows
    turns = [Turn(run.start, steps)]
    mk = lambda: make_drafter("racer", vocab_size=V)  # noqa: E731
    replay = Replay(turns, mk, cold_rows=rows)
    assert replay.before(len(steps) - 1).k == len(steps) - 1
    with pytest.raises(ReplayError, match="cold rows"):
        Replay(turns, mk).before(len(steps) - 1)
    # Told the run had none, the replayed drafter drafts nothing at those roots: caught at a step.
    turns[0].start.cold_rows = False
    with pytest.raises(ReplayError, match="step"):
        Replay(turns, mk, cold_rows=rows).before(len(steps) - 1)


def test_a_chat_that_got_cold_rows_mid_way_replays_each_turn_as_it_ran(lm, own_cache):
    rows = get_cold_rows(lm)
    lm.cold_rows = None
    drafter = make_drafter("racer", vocab_size=V)
    first = DecodeRun(lm, PROMPT, drafter, DecodeConfig(max_new_tokens=24, capacity=12))
    steps1 = list(first)
    lm.cold_rows = rows                     # the warm-up finished between the turns
    context = PROMPT + first.result.token_ids + [40, 41, 42]
    second = DecodeRun(lm, context, drafter, DecodeConfig(max_new_tokens=24, capacity=12), new_from=len(PROMPT))
    steps2 = list(second)
    assert not first.start.cold_rows and second.start.cold_rows
    turns = [Turn(first.start, steps1), Turn(second.start, steps2)]
    replay = Replay(turns, lambda: make_drafter("racer", vocab_size=V), cold_rows=rows)
    assert replay.before(len(steps2) - 1).k == len(steps2) - 1


def test_the_benchmark_makes_them_untimed_and_goes_on_without_them_when_it_cannot(lm, own_cache, monkeypatch):
    import io

    import racer.bench.runner as runner
    from racer.bench import BenchSettings, Row, run_rows
    rows = [Row("q1", "copy", ["x"])]
    st = BenchSettings(max_new_tokens=16, capacity=12, warmup=0)
    lm.cold_rows = None
    run_rows(lm, rows, ["ar", "racer"], st, encode=lambda msgs: PROMPT, progress=False)
    assert lm.cold_rows is not None                # made before any timed run
    lm.cold_rows = None

    def fail(lm_):
        raise RuntimeError("no batched cache for this architecture")
    monkeypatch.setattr(runner, "get_cold_rows", fail)
    log = io.StringIO()
    run = run_rows(lm, rows, ["ar", "racer"], st, encode=lambda msgs: PROMPT, progress=False, log=log)
    assert "cold rows could not be made (RuntimeError: no batched cache" in log.getvalue()
    assert {r["method"] for r in run.results} == {"ar", "racer"} and not run.errors
    assert run.results[0]["token_ids"] == run.results[1]["token_ids"]


def test_with_cold_rows_the_prefill_projects_only_the_final_position(lm, own_cache):
    """The prompt's own rows are skipped where cold rows stand in; without them every last
    occurrence gets its row; the output is plain greedy's either way."""
    plain = decode(lm, PROMPT, make_drafter("ar", vocab_size=V), DecodeConfig(max_new_tokens=40, capacity=1))
    lm.cold_rows = None
    warm = DecodeRun(lm, PROMPT, make_drafter("racer", vocab_size=V), DecodeConfig(max_new_tokens=40, capacity=12))
    list(warm)
    assert warm.start.rows == sorted({max(i for i, t in enumerate(PROMPT) if t == u) for u in set(PROMPT)})
    get_cold_rows(lm)
    run = DecodeRun(lm, PROMPT, make_drafter("racer", vocab_size=V), DecodeConfig(max_new_tokens=40, capacity=12))
    list(run)
    assert run.start.rows == [len(PROMPT) - 1] and run.start.cold_rows
    assert run.result.token_ids == warm.result.token_ids == plain.token_ids


def test_a_position_whose_row_was_not_made_leaves_the_tokens_row_as_it_was():
    store = CopyLogitStore(8, k=2)
    store.write([3], np.array([[4, 5]]), np.array([[0.6, 0.3]]))
    store.write([3, 2], np.array([[-1, -1], [6, 7]]), np.array([[-1.0, -1.0], [0.7, 0.2]]))
    assert store.expand(3, 10).tokens[:2] == [4, 5] and store.expand(2, 10).tokens[:2] == [6, 7]
    store.write([3], np.array([[1, 2]]), np.array([[0.5, 0.4]]))   # a made row still replaces it
    assert store.expand(3, 10).tokens[:2] == [1, 2]
