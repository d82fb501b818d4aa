"""Where racer keeps what it builds or measures once per machine: converted model weights, the
compiled CPU kernels and measured cost curves."""
from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """The cache folder: $RACER_CACHE, else $XDG_CACHE_HOME/racer-studio, else ~/.cache/racer-studio."""
    env = os.environ.get("RACER_CACHE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "racer-studio"
