"""Read records whether they arrive as dataclasses or as plain dicts (e.g. from JSON)."""
from __future__ import annotations

from typing import Any


def get(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


def tree_of(step: Any) -> Any:
    return get(step, "tree")


def tree_fields(tree: Any) -> dict[str, list]:
    """tokens, parents, sources, ranks, depths, meta of a DraftTree or its dict."""
    tokens = list(get(tree, "tokens", []))
    n = len(tokens)
    meta = list(get(tree, "meta", None) or [])
    meta = [m or {} for m in meta] + [{} for _ in range(n - len(meta))]
    return {
        "tokens": tokens,
        "parents": list(get(tree, "parents", [-1] * n)),
        "sources": list(get(tree, "sources", ["root"] + ["logits"] * (n - 1))),
        "ranks": list(get(tree, "ranks", None) or [0] * n),
        "depths": list(get(tree, "depths", None) or _depths(get(tree, "parents", [-1] * n))),
        "meta": meta,
    }


def _depths(parents):
    d = []
    for p in parents:
        d.append(0 if p < 0 else d[p] + 1)
    return d


def info_of(step: Any) -> dict:
    info = dict(get(step, "info", None) or {})
    tree = get(step, "tree")
    if tree is not None and not isinstance(tree, dict):
        for k, v in (getattr(tree, "info", None) or {}).items():
            info.setdefault(k, v)
    elif isinstance(tree, dict):
        for k, v in (tree.get("info") or {}).items():
            info.setdefault(k, v)
    return info
