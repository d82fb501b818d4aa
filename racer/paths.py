"""Where racer keeps what it builds or measures once per machine: converted model weights, the
compiled CPU kernels, measured cost curves and cold rows."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any


def cache_root() -> Path:
    """The cache folder: $RACER_CACHE, else $XDG_CACHE_HOME/racer-studio, else ~/.cache/racer-studio."""
    env = os.environ.get("RACER_CACHE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "racer-studio"


def keyed_file(folder: str, key: dict[str, Any], suffix: str) -> Path:
    """The cache file for what was made under `key` (a JSON-able dict): named by its hash, so a
    different model, device or format never reads another's."""
    h = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return cache_root() / folder / f"{h}{suffix}"
