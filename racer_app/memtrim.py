"""Give freed heap memory back to the operating system (glibc's malloc_trim). A decode
allocates and frees tens of MB in Gradio's worker threads; glibc keeps what was freed in
per-thread arenas, so without a trim the server's RSS stays at its high-water mark long after
the sessions that used it have gone. A no-op where the C library is not glibc."""
from __future__ import annotations

import ctypes
import ctypes.util
import threading


def _malloc_trim():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


class Trimmer:
    """`request()` asks for a trim; one daemon thread runs it `delay_s` later (by then the
    finished decode's frames are garbage), once per burst of requests."""

    def __init__(self, delay_s: float = 1.0) -> None:
        self.delay_s = float(delay_s)
        self._fn = _malloc_trim()
        self._due = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.trims = 0

    @property
    def available(self) -> bool:
        return self._fn is not None

    def request(self) -> None:
        if self._fn is None:
            return
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="racer-malloc-trim", daemon=True)
                self._thread.start()
        self._due.set()

    def _loop(self) -> None:
        while True:
            self._due.wait()
            self._due.clear()
            threading.Event().wait(self.delay_s)
            self._fn(0)
            self.trims += 1
