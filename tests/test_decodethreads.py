"""The decode slots (racer_app.decodethreads): every model computation of the server on one thread
per slot, results and errors handed back, the caller's context carried over, generators stepped
and closed there, and a second decode waiting for the slot."""
from __future__ import annotations

import contextvars
import threading

import pytest

from racer_app.decodethreads import DecodeSlots

who = contextvars.ContextVar("who", default="nobody")


def test_calls_run_on_the_slot_thread_with_the_callers_context():
    slots = DecodeSlots(1)
    who.set("visitor 7")
    name, seen = slots.call(lambda: (threading.current_thread().name, who.get()))
    assert name == "racer-decode" and seen == "visitor 7"
    with pytest.raises(ZeroDivisionError):
        slots.call(lambda: 1 / 0)
    assert slots.call(lambda x, y: x + y, 2, 3) == 5     # the slot survives an error
    # Work already on the slot's thread that asks for the slot again runs inline (no deadlock).
    assert slots.call(lambda: slots.call(lambda: threading.current_thread().name)) == "racer-decode"
    assert slots.call(lambda: list(slots.iterate(iter([1, 2])))) == [1, 2]


def test_a_generator_is_stepped_and_closed_on_the_slot_thread():
    slots = DecodeSlots(1)
    where: list[str] = []

    def work():
        try:
            for i in range(5):
                where.append(threading.current_thread().name)
                yield i
        finally:
            where.append("closed on " + threading.current_thread().name)

    it = slots.iterate(work())
    assert [next(it), next(it)] == [0, 1]
    it.close()                                # a client gone mid-stream
    assert where == ["racer-decode", "racer-decode", "closed on racer-decode"]
    assert slots.acquire(blocking=False) is not None      # and the slot was given back


def test_an_error_inside_the_generator_reaches_the_caller_and_frees_the_slot():
    slots = DecodeSlots(1)

    def work():
        yield "first"
        raise ValueError("bad prompt")

    it = slots.iterate(work())
    assert next(it) == "first"
    with pytest.raises(ValueError, match="bad prompt"):
        next(it)
    assert slots.acquire(blocking=False) is not None


def test_a_second_decode_waits_for_the_slot_and_says_so():
    slots = DecodeSlots(1)
    held = slots.acquire()
    frames: list[str] = []
    done = threading.Event()

    def visitor():
        for f in slots.iterate(iter(["decoded"]), waiting=lambda: "waiting"):
            frames.append(f)
        done.set()

    t = threading.Thread(target=visitor)
    t.start()
    assert not done.wait(0.3) and frames == ["waiting"]
    slots.release(held)
    assert done.wait(10) and frames == ["waiting", "decoded"]
    t.join()


def test_two_slots_run_two_decodes_at_once_on_their_own_threads():
    slots = DecodeSlots(2)
    barrier = threading.Barrier(2, timeout=10)
    names: list[str] = []

    def meet():
        names.append(threading.current_thread().name)
        barrier.wait()                        # both must be inside at the same time

    ts = [threading.Thread(target=slots.call, args=(meet,)) for _ in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert sorted(names) == ["racer-decode-0", "racer-decode-1"]
