"""A one-line progress bar with ETA on stderr (redrawn in place on a terminal, a line every
few seconds otherwise, e.g. in a log file)."""
from __future__ import annotations

import sys
import time
from typing import TextIO


def fmt_duration(s: float) -> str:
    s = max(0, int(round(s)))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


class Progress:
    def __init__(self, total: int, stream: TextIO | None = None, enabled: bool = True, width: int = 24,
                 log_every_s: float = 15.0) -> None:
        self.total = max(1, total)
        self.done = 0
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.width = width
        self.t0 = time.perf_counter()
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.log_every_s = log_every_s
        self._last_log = 0.0
        self._drawn = False

    def line(self, note: str = "") -> str:
        elapsed = time.perf_counter() - self.t0
        frac = min(1.0, self.done / self.total)
        fill = int(round(frac * self.width))
        bar = "#" * fill + "-" * (self.width - fill)
        eta = "?" if not self.done else fmt_duration(elapsed / self.done * (self.total - self.done))
        return f"[{bar}] {self.done}/{self.total} runs, {fmt_duration(elapsed)} elapsed, ETA {eta}" + \
            (f"  {note}" if note else "")

    def update(self, done: int | None = None, note: str = "") -> None:
        if done is not None:
            self.done = done
        if not self.enabled:
            return
        now = time.perf_counter()
        if self.tty:
            self.stream.write("\r\033[K" + self.line(note)[:200])
            self.stream.flush()
            self._drawn = True
        elif now - self._last_log >= self.log_every_s or self.done >= self.total:
            self._last_log = now
            self.stream.write(self.line(note) + "\n")
            self.stream.flush()

    def message(self, text: str) -> None:
        """Print a line without breaking the bar."""
        if self.enabled and self.tty and self._drawn:
            self.stream.write("\r\033[K")
        self.stream.write(text + "\n")
        self.stream.flush()
        if self.enabled and self.tty and self._drawn:
            self.update()

    def close(self) -> None:
        if self.enabled and self.tty and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
