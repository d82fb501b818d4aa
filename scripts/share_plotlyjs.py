"""Point every committed benchmark plot at one shared plotly.min.js.

Each bench run writes plots/plotly.min.js (4.6 MB) beside its pages so a report folder works
offline on its own. In the repository one copy is enough:

    python scripts/share_plotlyjs.py benchmarks

moves one copy to benchmarks/plotly.min.js, deletes the others and rewrites each page's
<script src> to the relative path of the shared copy.
"""
from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

SRC = re.compile(r'(<script charset="utf-8" src=")[^"]*plotly\.min\.js(")')


def share(root: Path) -> int:
    shared = root / "plotly.min.js"
    changed = 0
    for local in sorted(root.rglob("plots/plotly.min.js")):
        if not shared.exists():
            shutil.copyfile(local, shared)
        local.unlink()
    for page in sorted(root.rglob("plots/*.html")):
        rel = os.path.relpath(shared, page.parent).replace(os.sep, "/")
        text = page.read_text(encoding="utf-8")
        new = SRC.sub(lambda m: m.group(1) + rel + m.group(2), text)
        if new != text:
            page.write_text(new, encoding="utf-8")
            changed += 1
    return changed


if __name__ == "__main__":
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks")
    print(f"{share(root)} pages now load {root / 'plotly.min.js'}")
