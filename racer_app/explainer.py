"""The "How it works" walk: short paragraphs, each next to a figure drawn from a small preset
RACER run on the loaded model (the same figures as the inspector).

The preset run is the same for everyone (a fixed prompt, greedy), so it is cached per model
in this process; it holds no user data.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

PRESET_TITLE = "Rename in code"
PRESET_TOKENS_CPU = 64
PRESET_TOKENS_GPU = 96

INTRO = """### How RACER makes a language model faster — without changing a single word it writes

A language model writes one token (a word piece) at a time. Each token needs one **forward pass**:
the whole model is read from memory to compute it. On a small batch that pass costs almost the same
whether the model checks one token or a dozen, so most of the machine's effort is waiting for memory.

**Speculative decoding** uses that slack: guess several next tokens (a *draft*), let the model check
them all in one pass, keep the ones it agrees with. The model always has the last word, so the text
is exactly what it would have written alone — only faster when the guesses are good.

Below, every picture comes from a real run of the model on a small preset prompt (renaming a variable
in a piece of code: a task where much of the answer is copied from the question)."""

SECTIONS: dict[str, str] = {
    "tree": """#### 1 · A draft is a tree, checked in one pass

RACER does not guess one continuation but a **tree** of them: several candidates for the next token,
and candidates after each of those. The model reads the whole tree in one forward pass (*tree
attention*: each candidate sees the text so far plus its own ancestors) and returns its own choice at
every node. Starting from the root, we walk down as long as a child is exactly what the model would
have picked. That walk is the **accepted path** (thick black below). The model's choice after the last
accepted node comes free as well — it becomes the next step's root (the dotted box).

**MAT** (mean accepted tokens) counts how many tokens one forward pass commits on average; plain
decoding has MAT 1.""",
    "automaton": """#### 2 · Drafts from what was already written: the automaton

Text repeats itself: names, code lines, phrases from the question. RACER keeps every recent
n-gram (up to 10 tokens) of the prompt and of its own answer in an **Aho–Corasick automaton**, a trie
with *failure links* (dashed) that jump to the longest suffix that is also stored. The **match state**
(black frame) is the longest stored string that ends the text so far. The **borders** (blue frames) are
the state and its shorter suffixes; whatever followed them before is proposed again as a retrieval
draft. Colours show how long ago each node was used: when the automaton is full, the oldest leaves
are recycled first.""",
    "logits": """#### 3 · Drafts from what the model predicted before: copy-logit

When nothing repeats, the model's own recent predictions still help. Every forward pass produces a
ranking of next tokens; RACER stores the top 8 for each token it has seen (**copy-logit**: the ranking
from the last time *this* token was fed to the model). To extend a draft after token *x*, it copies
*x*'s row: rank 1 gets the widest subtree, rank 2 half as wide, and so on. The table below shows
the rows one step used; coloured entries became tree nodes, framed ones were accepted.""",
    "merge": """#### 4 · Merging the two, and where each token came from

Each step has a fixed budget of tree nodes. Retrieval candidates go in first (they are long and
usually right when they exist); the copy-logit tree fills the rest. Where both propose the same path
the branches merge (green, *both*). The chart shows, step by step, how many committed tokens came
from each source: **blue** from retrieval, **orange** from copy-logit, **green** from both, grey the
model's own token that every step commits.""",
    "cost": """#### 5 · Why the tree size depends on your hardware

Checking a bigger tree accepts more tokens, but the forward pass gets slower — a little on a GPU,
a lot on a small CPU. The best size is where *expected tokens per second* peaks, and that point
moves with the machine. RACER Studio measures this curve for the hardware it runs on (the Benchmark
view shows it); with **capacity = auto**, RACER picks the size at every step from it.""",
    "limits": """#### 6 · Where RACER cannot help

When the answer is short and new — a haiku, a joke, a list of fresh ideas — there is little to
copy, and the model's earlier predictions rarely match. Drafts are then mostly rejected and the speed
is close to plain decoding (never wrong, though: the model still checks every token). Try the
*Short original poem* and the *Rename in code* examples in the Race view to see both ends.""",
}


@dataclass
class Preset:
    trace: Any                 # racer_app.session.Trace
    tree_step: int             # a step with a long accepted path
    logits_step: int           # a step whose rows were used and accepted
    auto_step: int             # a step with a rich automaton picture


_cache: dict[str, Preset] = {}
_lock = threading.Lock()


def pick_steps(steps: list[Any]) -> tuple[int, int, int]:
    """Steps that illustrate each section well (a long accepted path; a logits acceptance; a deep match)."""
    def count(s: Any, src: str) -> int:
        acc = s.accepted[1:len(s.committed)]
        return sum(1 for i in acc if s.tree.sources[i] in src)

    fw = [i for i, s in enumerate(steps) if s.forwarded] or [0]
    # prefer a step with a long accepted path and a tree that is not enormous to read
    tree_step = max(fw, key=lambda i: (len(steps[i].committed), -len(steps[i].tree)))
    logits_step = max(fw, key=lambda i: (count(steps[i], ("logits", "both")), bool(steps[i].info.get("copy_rows")),
                                         -i))
    auto_step = max(fw, key=lambda i: (int(steps[i].info.get("match_depth", 0) or 0) > 0,
                                       bool(steps[i].info.get("automaton")), i != tree_step,
                                       count(steps[i], ("retrieval", "both"))))
    return tree_step, logits_step, auto_step


def get_preset(key: str) -> Preset | None:
    return _cache.get(key)


def put_preset(key: str, preset: Preset) -> None:
    with _lock:
        _cache[key] = preset
