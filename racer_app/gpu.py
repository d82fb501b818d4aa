"""ZeroGPU support: `on_gpu(duration)` is `spaces.GPU(duration=...)` on a ZeroGPU Space
(SPACES_ZERO_GPU set) and returns the function unchanged everywhere else."""
from __future__ import annotations

import os
from typing import Any, Callable


def zero_gpu() -> bool:
    return os.environ.get("SPACES_ZERO_GPU", "").lower() in ("1", "true", "yes")


def on_gpu(duration: int = 120) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        if not zero_gpu():
            return fn
        try:
            import spaces
        except ImportError:
            return fn
        return spaces.GPU(duration=duration)(fn)
    return wrap
