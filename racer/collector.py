"""Python's cyclic garbage collector held off across timed decoding work.

A decode allocates many short-lived containers per forward, which trigger collections; now and
then one of them is a full collection of the process's whole heap (about 370,000 objects with
torch and transformers imported on a CPU, more with CUDA's libraries: 190 ms on a 2-core CPU,
up to 360 ms on the GPU machine). On an H200, where a small model's forward is bound by the host
launching its kernels, those pauses land inside the forwards: SmolLM2's median one-token forward in
the decode loop took 64 ms with the collector on and 30 ms with it off
(benchmarks/smollm2-135m-shipped-bfloat16-h200-2026-12-04/diag.txt). A decode makes almost no
cyclic garbage (a `gc.collect()` after a 128-token RACER decode with the collector off found 0-10
objects), so holding the collector off costs no memory that matters.
"""
from __future__ import annotations

import gc
import threading
from contextlib import contextmanager
from typing import Iterator

_lock = threading.Lock()
_holders = 0
_was_on = True


@contextmanager
def collector_paused() -> Iterator[None]:
    """Hold the collector off for the block. Nested and thread-safe (two decodes at once on a GPU
    server, a race's lanes): it comes back when the last holder leaves, and only if it was on
    before the first. Never hold it across a `yield` that a consumer may abandon: the decode loop
    holds it for one step at a time."""
    global _holders, _was_on
    with _lock:
        if _holders == 0:
            _was_on = gc.isenabled()
            gc.disable()
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0 and _was_on:
                gc.enable()
