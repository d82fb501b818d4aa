"""Python's cyclic collector is held off inside every decode step (racer.collector): a full
collection landing inside a forward slowed the GPU's decode loop two- to four-fold. The hold is per
step, never across a yield, so a consumer that stops iterating leaves the collector as it was."""
import gc
import threading

import pytest

from racer import DecodeConfig, DecodeRun, decode, make_drafter
from racer.collector import collector_paused
from racer.tiny import tiny_lm

V = 64


@pytest.fixture(scope="module")
def lm():
    return tiny_lm(vocab=V)


@pytest.fixture(autouse=True)
def _collector_on():
    gc.enable()
    yield
    gc.enable()


def spy_forwards(lm, monkeypatch):
    """Record gc.isenabled() at every forward of `lm`'s model."""
    seen: list[bool] = []
    inner = lm.model.forward

    def forward(*args, **kwargs):
        seen.append(gc.isenabled())
        return inner(*args, **kwargs)
    monkeypatch.setattr(lm.model, "forward", forward)
    return seen


def test_the_hold_nests_and_restores_what_was_there():
    with collector_paused():
        assert not gc.isenabled()
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    with collector_paused():
        pass
    assert not gc.isenabled(), "a collector that was off stays off"


def test_two_threads_holding_at_once_release_it_once_both_are_done():
    inside, release = threading.Barrier(2), threading.Event()

    def hold():
        with collector_paused():
            inside.wait()
            release.wait(5)
    t = threading.Thread(target=hold)
    t.start()
    with collector_paused():
        inside.wait()
    assert not gc.isenabled(), "the other thread still holds it"
    release.set()
    t.join()
    assert gc.isenabled()


def test_every_forward_runs_held_and_the_consumer_runs_free(lm, monkeypatch):
    seen = spy_forwards(lm, monkeypatch)
    between = []
    prompt = [1, 2, 3, 4, 5, 6, 1, 2, 3, 4]
    for _ in DecodeRun(lm, prompt, make_drafter("racer", vocab_size=V), DecodeConfig(max_new_tokens=12, capacity=8)):
        between.append(gc.isenabled())
    assert len(seen) >= 2 and not any(seen), "a forward ran with the collector on"
    assert between and all(between), "the collector stayed off between steps"


def test_a_consumer_that_stops_early_leaves_the_collector_on(lm):
    run = DecodeRun(lm, [3, 4, 5, 6, 7], make_drafter("ar"), DecodeConfig(max_new_tokens=20))
    for i, _ in enumerate(run):
        if i == 2:
            break
    assert gc.isenabled()


def test_decode_holds_it_for_the_whole_run(lm, monkeypatch):
    seen = spy_forwards(lm, monkeypatch)
    during = []
    decode(lm, [3, 4, 5, 6, 7], make_drafter("ar"), DecodeConfig(max_new_tokens=6),
           on_step=lambda rec: during.append(gc.isenabled()))
    assert seen and not any(seen) and during and not any(during)
    assert gc.isenabled()
