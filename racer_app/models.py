"""The models this server shares between requests (weights are shared; decoding state never is).

The start-up model loads in a background thread so the page can show a status while the
first conversion runs; handlers call `get()` which waits for it. Other models (the other shipped
ones, and hub ids / folders the server allows in RACER_ALLOWED_MODELS) load on first use and are
kept (a small LRU) once loaded.
"""
from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from typing import Any, Callable

from racer.models import LoadedModel, ModelLoadError

Loader = Callable[[str], LoadedModel]


def _default_loader(spec: str) -> LoadedModel:
    from racer.models import load_model
    return load_model(spec, device=os.environ.get("RACER_DEVICE", "auto"), dtype=os.environ.get("RACER_DTYPE", "auto"))


class ModelStore:
    """`get("default")` is the start-up model (the embedded default, or RACER_MODEL)."""

    def __init__(self, lm: LoadedModel | None = None, start_spec: str | None = None,
                 allowed: list[str] | None = None, loader: Loader | None = None, keep: int = 2) -> None:
        self.start_spec = start_spec or os.environ.get("RACER_MODEL", "default")
        self.allowed = list(allowed or ["default"])
        self.loader = loader or _default_loader
        self.keep = max(1, keep)
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._models: "OrderedDict[str, LoadedModel]" = OrderedDict()
        self.error: str | None = None
        self.started_at = time.time()
        self.load_s: float | None = None
        if lm is not None:
            self._models["default"] = lm
            self.load_s = lm.load_s
            self._ready.set()

    # -- start-up -------------------------------------------------------------------------

    def start(self, background: bool = True) -> None:
        """Load the start-up model (once)."""
        if self._ready.is_set():
            return
        if background:
            threading.Thread(target=self._load_default, name="racer-model-load", daemon=True).start()
        else:
            self._load_default()

    def _load_default(self) -> None:
        t0 = time.perf_counter()
        try:
            lm = self.loader(self.start_spec)
            with self._lock:
                self._models["default"] = lm
            self.load_s = time.perf_counter() - t0
        except ModelLoadError as e:
            self.error = str(e)
        except Exception as e:  # noqa: BLE001 - the page shows it; the server stays up
            self.error = f"{e.__class__.__name__}: {e}"
        finally:
            self._ready.set()

    @property
    def ready(self) -> bool:
        return self._ready.is_set() and "default" in self._models

    @property
    def loading(self) -> bool:
        return not self._ready.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._ready.wait(timeout)

    # -- access ---------------------------------------------------------------------------

    def get(self, spec: str = "default", timeout: float | None = 600) -> LoadedModel:
        """The model for `spec` (waits for the start-up load). Raises ModelLoadError with a
        message fit for the page."""
        if not self._ready.wait(timeout):
            raise ModelLoadError("the model is still loading; try again in a moment")
        spec = spec or "default"
        if spec not in self.allowed:
            raise ModelLoadError(f"model '{spec}' is not allowed on this server")
        with self._lock:
            if spec in self._models:
                self._models.move_to_end(spec)
                return self._models[spec]
        if spec == "default":
            raise ModelLoadError(f"the default model could not be loaded: {self.error}")
        with self._lock:  # one load at a time; others wait for it
            if spec in self._models:
                return self._models[spec]
            lm = self.loader(spec)
            self._models[spec] = lm
            while len(self._models) > self.keep:
                oldest = next(k for k in self._models if k != "default")
                self._models.pop(oldest)
            return lm

    def peek(self, spec: str = "default") -> LoadedModel | None:
        return self._models.get(spec)

    def status(self) -> dict[str, Any]:
        lm = self._models.get("default")
        if lm is not None:
            d = lm.describe()
            d["state"] = "ready"
            return d
        if self.error:
            return {"state": "error", "error": self.error, "spec": self.start_spec}
        return {"state": "loading", "spec": self.start_spec, "elapsed_s": round(time.time() - self.started_at, 1)}
