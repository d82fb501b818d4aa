"""Bounded disk for benchmark outputs: one folder per session under one root for this server.

    root/<session id>/<run>/report.md, summary.json

A session keeps its latest run only; its folder goes when the session ends (tab closed, state
expired or dropped) and any run goes once it is older than `max_age_s`; if all runs together
pass `max_bytes`, the oldest go first. A sweep runs after every new run and on a timer.
(Gradio serves copies of the returned files from its own cache, aged out by StudioBlocks'
`delete_cache` on the same schedule.)
"""
from __future__ import annotations

import atexit
import logging
import re
import shutil
import tempfile
import threading
import time
from pathlib import Path

log = logging.getLogger("racer_app")
_SAFE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def _tree_bytes(path: Path) -> int:
    total = 0
    for p in path.rglob("*"):
        try:
            if p.is_file():
                total += p.stat().st_size
        except OSError:
            pass
    return total


class Workspace:
    def __init__(self, root: str | Path | None = None, max_age_s: float = 3600.0, max_bytes: int = 256 * 2**20) -> None:
        self._root = Path(root) if root is not None else None
        self.max_age_s = float(max_age_s)
        self.max_bytes = int(max_bytes)
        self._lock = threading.Lock()
        self._timer: threading.Thread | None = None
        self._stop = threading.Event()

    @property
    def root(self) -> Path:
        """The folder (made on first use; removed when the process exits)."""
        if self._root is None:
            self._root = Path(tempfile.mkdtemp(prefix="racer-studio-"))
            atexit.register(shutil.rmtree, str(self._root), True)
        self._root.mkdir(parents=True, exist_ok=True)
        return self._root

    def _session_dir(self, session_id: str) -> Path:
        if not _SAFE.match(session_id):   # ids are made by Session, never by a visitor; stay inside root anyway
            raise ValueError(f"bad session id {session_id!r}")
        return self.root / session_id

    def new_run(self, session_id: str) -> Path:
        """A fresh folder for this session's next run; its earlier runs are removed."""
        d = self._session_dir(session_id)
        with self._lock:
            if d.is_dir():
                for old in d.iterdir():
                    shutil.rmtree(old, ignore_errors=True)
            d.mkdir(parents=True, exist_ok=True)
            return Path(tempfile.mkdtemp(prefix="run-", dir=d))

    def remove_session(self, session_id: str) -> None:
        if self._root is None:
            return
        try:
            d = self._session_dir(session_id)
        except ValueError:
            return
        with self._lock:
            shutil.rmtree(d, ignore_errors=True)

    def runs(self) -> list[tuple[float, Path]]:
        """(modification time, folder) of every run, oldest first."""
        out: list[tuple[float, Path]] = []
        if self._root is None or not self._root.is_dir():
            return out
        for sd in self._root.iterdir():
            if not sd.is_dir():
                continue
            for run in sd.iterdir():
                try:
                    out.append((run.stat().st_mtime, run))
                except OSError:
                    pass
        return sorted(out, key=lambda x: x[0])

    def size(self) -> int:
        return _tree_bytes(self._root) if self._root is not None and self._root.is_dir() else 0

    def sweep(self, keep: Path | None = None, now: float | None = None) -> int:
        """Remove runs past their age, then the oldest until the total fits; `keep` (the run
        just written) stays. Empty session folders go too. Returns the runs removed."""
        now = time.time() if now is None else now
        removed = 0
        with self._lock:
            runs = self.runs()
            sizes = {run: _tree_bytes(run) for _, run in runs}
            total = sum(sizes.values())
            for mtime, run in runs:
                if run == keep:
                    continue
                if now - mtime > self.max_age_s or total > self.max_bytes:
                    shutil.rmtree(run, ignore_errors=True)
                    total -= sizes[run]
                    removed += 1
            folders = list(self._root.iterdir()) if self._root is not None and self._root.is_dir() else []
            for sd in folders:
                try:
                    if sd.is_dir() and not any(sd.iterdir()):
                        sd.rmdir()
                except OSError:
                    pass
        return removed

    def start(self, every_s: float = 60.0) -> None:
        """Sweep on a timer (a daemon thread) until `close`."""
        if self._timer is not None:
            return

        def loop() -> None:
            while not self._stop.wait(every_s):
                try:
                    self.sweep()
                except Exception:  # noqa: BLE001 - the next sweep tries again
                    log.exception("workspace sweep failed")
        self._timer = threading.Thread(target=loop, name="racer-workspace-sweep", daemon=True)
        self._timer.start()

    def close(self) -> None:
        self._stop.set()
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
