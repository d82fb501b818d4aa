"""The decode slots: every model computation of the server runs on one long-lived thread per slot.

    slots = DecodeSlots(1)
    with slots.hold() as slot:            # waits for the slot, like a semaphore
        curve = slot.call(make_sizer, lm)  # runs on the slot's thread, returns or raises here
    for frame in slots.iterate(worker_gen, waiting=...):  # a generator stepped on the slot's thread
        ...

Why a thread and not just a lock: PyTorch's CPU operators run on OpenMP (libgomp), and every thread
that starts a parallel region keeps a pool of worker threads until it exits. Once a process holds
more such threads than it has CPUs, libgomp stops spinning between parallel regions: its workers
go to sleep after every region, and each of a forward's few hundred regions waits for a wake-up.
Gradio runs handlers on a pool of worker threads, so decodes landed on several of them and the
warm-up ran on its own: on a 2-core CPU an `ar` forward of the default model (bfloat16) took
16-19 ms from one thread and 31-36 ms from a second one while the first kept its pool
(`python scripts/omp_threads.py`). With every forward on the slot's one thread the server decodes
as fast as a script, and a race's lanes are timed as the benchmark times them.

Calls run in a copy of the caller's context (contextvars), so Gradio's request context
(`gr.Info`, `gr.Progress`) works on the slot's thread as it does on the handler's.
"""
from __future__ import annotations

import contextvars
import queue
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator, TypeVar

T = TypeVar("T")

_DONE = object()


class DecodeSlot:
    """One thread that runs what it is given, one call at a time, in the caller's context."""

    def __init__(self, name: str) -> None:
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            ctx, fn, args, box, done = self._inbox.get()
            try:
                box.append((True, ctx.run(fn, *args)))
            except BaseException as e:  # noqa: BLE001 - handed back to the caller, raised there
                box.append((False, e))
            # Nothing of a finished call may stay referenced while the thread waits for the next
            # (a closed race's generator holds its KV caches).
            del ctx, fn, args, box
            done.set()

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on this slot's thread; its result, or its exception raised here."""
        if threading.current_thread() is self.thread:
            return fn(*args)
        box: list[tuple[bool, Any]] = []
        done = threading.Event()
        self._inbox.put((contextvars.copy_context(), fn, args, box, done))
        done.wait()
        ok, value = box[0]
        if ok:
            return value
        raise value

    def iterate(self, gen: Iterator[T]) -> Iterator[T]:
        """Step `gen` on this slot's thread, yielding what it yields here. Closing this iterator
        (a client gone, a generator dropped) closes `gen` on the slot's thread as well."""
        step = lambda: next(gen, _DONE)  # noqa: E731
        try:
            while True:
                item = self.call(step)
                if item is _DONE:
                    return
                yield item
        finally:
            close = getattr(gen, "close", None)
            if close is not None:
                self.call(close)


class DecodeSlots:
    """`n` decode slots (one per decode that may run at once: 1 on a CPU), each with its thread."""

    def __init__(self, n: int, name: str = "racer-decode") -> None:
        self.n = max(1, int(n))
        self._free: queue.Queue[DecodeSlot] = queue.Queue()
        slots = [DecodeSlot(f"{name}-{i}" if self.n > 1 else name) for i in range(self.n)]
        self._threads = frozenset(s.thread for s in slots)
        for slot in slots:
            self._free.put(slot)

    def _inside(self) -> bool:
        """Whether this thread is a slot's own: it already holds that slot, so its work runs inline
        (waiting for a slot there would wait for itself)."""
        return threading.current_thread() in self._threads

    def acquire(self, blocking: bool = True) -> DecodeSlot | None:
        try:
            return self._free.get(block=blocking)
        except queue.Empty:
            return None

    def release(self, slot: DecodeSlot) -> None:
        self._free.put(slot)

    @contextmanager
    def hold(self) -> Iterator[DecodeSlot]:
        """A free slot for the `with` block (waiting for one)."""
        slot = self.acquire()
        assert slot is not None
        try:
            yield slot
        finally:
            self.release(slot)

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on a free slot's thread (waiting for one)."""
        if self._inside():
            return fn(*args)
        with self.hold() as slot:
            return slot.call(fn, *args)

    def iterate(self, gen: Iterator[T], waiting: Callable[[], T] | None = None) -> Iterator[T]:
        """Step `gen` on a free slot's thread, holding the slot until it ends; while every slot is
        taken, first yield `waiting()` (if given) and wait."""
        if self._inside():
            yield from gen
            return
        slot = self.acquire(blocking=False)
        if slot is None:
            if waiting is not None:
                yield waiting()
            slot = self.acquire()
            assert slot is not None
        try:
            yield from slot.iterate(gen)
        finally:
            self.release(slot)
