"""How much memory an object graph holds: `deep_size` follows containers and instance
attributes, counts numpy arrays and torch tensors by their buffers, and skips what is shared
between sessions (functions, modules, models, tokenizers, the hardware cost curve), so a
session's figure is what that session alone keeps alive."""
from __future__ import annotations

import sys
import threading
import types
from collections import deque
from typing import Any, Iterable

_LEAF = (str, bytes, bytearray, int, float, complex, bool, type(None))
_SKIP = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
         threading.Event, type(threading.Lock()), type(threading.RLock()))


def _skipped(o: Any) -> bool:
    if isinstance(o, _SKIP):
        return True
    cls = type(o)
    name = cls.__name__
    mod = cls.__module__ or ""
    # Shared with every session: the model and its tokenizer, the cost curve, partials over them.
    if name in ("partial", "CostCurve", "LoadedModel") or mod.startswith(("transformers", "tokenizers")):
        return True
    try:
        import torch
        if isinstance(o, torch.nn.Module):
            return True
    except ImportError:  # pragma: no cover
        pass
    return False


def deep_size(roots: Iterable[Any]) -> int:
    """Bytes held by `roots` and everything they reach (each object counted once)."""
    seen: set[int] = set()
    stack = list(roots)
    total = 0
    try:
        import numpy as np
    except ImportError:  # pragma: no cover
        np = None
    try:
        import torch
    except ImportError:  # pragma: no cover
        torch = None
    while stack:
        o = stack.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        if isinstance(o, _LEAF):
            total += sys.getsizeof(o)
            continue
        if _skipped(o):
            continue
        if np is not None and isinstance(o, np.ndarray):
            total += sys.getsizeof(o) + (o.nbytes if o.base is None else 0)
            continue
        if torch is not None and isinstance(o, torch.Tensor):
            total += o.element_size() * o.nelement()
            continue
        total += sys.getsizeof(o)
        if isinstance(o, dict):
            stack.extend(o.keys())
            stack.extend(o.values())
        elif isinstance(o, (list, tuple, set, frozenset, deque)):
            stack.extend(o)
        else:
            d = getattr(o, "__dict__", None)
            if d is not None:
                stack.append(d)
            for slot in getattr(type(o), "__slots__", ()) or ():
                if isinstance(slot, str) and hasattr(o, slot):
                    stack.append(getattr(o, slot))
    return total
