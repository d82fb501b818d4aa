"""Drafter registry: `make_drafter(method, **opts)` builds a fresh drafter (= fresh session state)."""
from __future__ import annotations

import inspect
from typing import Any, Callable

from .ar import ARDrafter
from .base import Drafter, Verified
from .pld import PLDDrafter
from .racer import RacerDrafter
from .tr import TokenRecyclingDrafter

_FACTORIES: dict[str, tuple[Callable[..., Drafter], dict[str, Any]]] = {
    "ar": (ARDrafter, {}),
    "pld": (PLDDrafter, {}),
    "tr": (TokenRecyclingDrafter, {}),
    "racer": (RacerDrafter, {"merge": "merge"}),
    # The paper's drafter: no prompt-lookup chain and no cold rows (see racer.drafters.racer).
    # The ablations below leave both out too, so they compare with racer-nochain.
    "racer-nochain": (RacerDrafter, {"lookup_chain": False, "cold_rows": False}),
    # racer without the model's cold rows (racer.coldrows) for roots the context never fed.
    "racer-nocold": (RacerDrafter, {"cold_rows": False}),
    # Tree sizing without the copy-logit entries' probabilities (ranks only): the ablation of the row-probability buckets.
    "racer-ranks": (RacerDrafter, {"row_probs": False}),
    "racer-half": (RacerDrafter, {"merge": "half", "lookup_chain": False, "cold_rows": False}),
    "racer-hard": (RacerDrafter, {"merge": "hard", "lookup_chain": False, "cold_rows": False}),
    "racer-retrieval": (RacerDrafter, {"logits": False, "lookup_chain": False, "cold_rows": False}),
    "racer-logits": (RacerDrafter, {"retrieval": False, "lookup_chain": False, "cold_rows": False}),
    # The released code's breadth rule (halving at the root too), for the ablation table.
    "racer-released": (RacerDrafter, {"breadth_rule": "released", "lookup_chain": False, "cold_rows": False}),
}

METHODS: tuple[str, ...] = tuple(_FACTORIES)

#: Options the loop may pass to every method; dropped for drafters that don't take them.
_COMMON_OPTS = ("vocab_size",)


def make_drafter(method: str, **opts: Any) -> Drafter:
    """A new drafter for `method`. Variants fix their own settings (e.g. "racer-half" fixes
    merge="half"); passing a conflicting value is an error rather than a silent override."""
    try:
        cls, fixed = _FACTORIES[method]
    except KeyError:
        raise ValueError(f"unknown method {method!r}; known: {', '.join(METHODS)}") from None
    for k, v in fixed.items():
        if k in opts and opts[k] != v:
            raise ValueError(f"method {method!r} fixes {k}={v!r}; got {k}={opts[k]!r}")
    params = inspect.signature(cls).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    kwargs = {k: v for k, v in opts.items() if takes_any or k in params or k not in _COMMON_OPTS}
    kwargs.update(fixed)
    if "name" in params:
        kwargs.setdefault("name", method)
    return cls(**kwargs)


def takes_option(method: str, option: str) -> bool:
    """Whether `method`'s drafter has the setting `option` (False for an unknown method)."""
    entry = _FACTORIES.get(method) if isinstance(method, str) else None
    return entry is not None and option in inspect.signature(entry[0]).parameters


__all__ = ["Drafter", "Verified", "METHODS", "make_drafter", "takes_option", "ARDrafter",
           "PLDDrafter", "RacerDrafter", "TokenRecyclingDrafter"]
