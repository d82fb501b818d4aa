"""Tidy tree layout (Reingold–Tilford style) for boxes of different sizes.

Works on one "breadth" axis: each subtree is packed against its left siblings as closely as
the per-depth contours allow (`gap` apart at every depth), then every parent is centred over
its first and last child. The result has no edge crossings, parents centred, and no two
boxes of the same depth closer than `gap`. Depth is the other axis; the caller maps both
axes to the screen (top-down or left-to-right).
"""
from __future__ import annotations

from typing import Sequence


def children_of(parents: Sequence[int]) -> tuple[list[int], list[list[int]]]:
    """Roots and child lists (children in index order) of a parent array (-1 = root)."""
    kids: list[list[int]] = [[] for _ in parents]
    roots = []
    for i, p in enumerate(parents):
        if p is None or p < 0:
            roots.append(i)
        else:
            kids[p].append(i)
    return roots, kids


def tidy_positions(parents: Sequence[int], sizes: Sequence[float], gap: float,
                   roots: Sequence[int] | None = None) -> list[float]:
    """Centre coordinate of every node along the breadth axis (leftmost extent = 0).

    `sizes[i]` is node i's extent along the breadth axis. Nodes need not be in topological
    order; several roots are laid out side by side as a forest.
    """
    n = len(parents)
    if n == 0:
        return []
    found_roots, kids = children_of(parents)
    roots = list(roots) if roots is not None else found_roots
    offset = [0.0] * n            # node centre relative to its parent's centre
    contour: list[list[tuple[float, float]] | None] = [None] * n

    # iterative post-order
    order, stack = [], list(reversed(roots))
    while stack:
        v = stack.pop()
        order.append(v)
        stack.extend(reversed(kids[v]))
    for v in reversed(order):
        half = sizes[v] / 2.0
        if not kids[v]:
            contour[v] = [(-half, half)]
            continue
        acc, offs = _pack([contour[c] for c in kids[v]], gap)
        mid = (offs[0] + offs[-1]) / 2.0
        for c, o in zip(kids[v], offs):
            offset[c] = o - mid
            contour[c] = None  # free memory
        contour[v] = [(-half, half)] + [(lo - mid, hi - mid) for lo, hi in acc]

    # forest: pack the roots' contours side by side
    root_contours = []
    for r in roots:
        root_contours.append(_subtree_contour(r, kids, offset, sizes) if contour[r] is None else contour[r])
    acc, offs = _pack(root_contours, gap)
    left = min(lo for lo, _ in acc)
    pos = [0.0] * n
    for r, o in zip(roots, offs):
        pos[r] = o - left
        stack = [r]
        while stack:
            v = stack.pop()
            for c in kids[v]:
                pos[c] = pos[v] + offset[c]
                stack.append(c)
    return pos


def _pack(contours: list[list[tuple[float, float]]], gap: float) -> tuple[list[tuple[float, float]], list[float]]:
    """Place contours left to right as close as `gap` allows; returns merged contour, offsets."""
    acc = list(contours[0])
    offs = [0.0]
    for c in contours[1:]:
        shift = max(acc[d][1] - c[d][0] + gap for d in range(min(len(acc), len(c))))
        offs.append(shift)
        for d, (lo, hi) in enumerate(c):
            if d < len(acc):
                acc[d] = (acc[d][0], hi + shift)
            else:
                acc.append((lo + shift, hi + shift))
    return acc, offs


def _subtree_contour(r, kids, offset, sizes):
    out: dict[int, list[float]] = {}
    stack = [(r, 0.0, 0)]
    while stack:
        v, x, d = stack.pop()
        lo, hi = x - sizes[v] / 2, x + sizes[v] / 2
        if d in out:
            out[d] = [min(out[d][0], lo), max(out[d][1], hi)]
        else:
            out[d] = [lo, hi]
        for c in kids[v]:
            stack.append((c, x + offset[c], d + 1))
    return [tuple(out[d]) for d in range(len(out))]


def boxes_overlap(a: tuple[float, float, float, float], b: tuple[float, float, float, float],
                  tol: float = 0.0) -> bool:
    """Whether two (x0, y0, x1, y1) boxes overlap by more than `tol`."""
    return (min(a[2], b[2]) - max(a[0], b[0]) > tol) and (min(a[3], b[3]) - max(a[1], b[1]) > tol)


def collisions(boxes: Sequence[tuple[float, float, float, float]], tol: float = 0.0) -> list[tuple[int, int]]:
    """Index pairs of overlapping boxes (sweep over x)."""
    order = sorted(range(len(boxes)), key=lambda i: boxes[i][0])
    out, active = [], []
    for i in order:
        active = [j for j in active if boxes[j][2] > boxes[i][0] + tol]
        for j in active:
            if boxes_overlap(boxes[i], boxes[j], tol):
                out.append((min(i, j), max(i, j)))
        active.append(i)
    return out
