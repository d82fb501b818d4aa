"""The "How it works" walk: short paragraphs, each next to a figure drawn from two preset RACER
runs on the loaded model (the same figures as the inspector): one where RACER wins (renaming
a variable in code: the answer copies the question) and one where it cannot (a one-line
joke: new text). The walk follows one step of the first run through the seven stages of the
inspector's anatomy, in order.

The preset runs are the same for everyone (fixed prompts, greedy), so they are made once per
model in this process; they hold no user data. Without a loaded model (it is still loading,
or this server has none) the walk uses the example traces that ship with the app, and says so.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from .glossary import term

#: The two presets: (example title, what it shows).
WIN_TITLE = "Rename in code"
CANNOT_TITLE = "One-line joke"
PRESET_TITLE = WIN_TITLE
PRESET_TOKENS_CPU = 64
PRESET_TOKENS_GPU = 96

INTRO = f"""### How RACER makes a language model faster — without changing a single word it writes

A language model writes one {term('token')} (a word piece) at a time. Each token needs one
**{term('forward pass')}**: the whole model is read from memory to compute it. On a small batch that pass costs
almost the same whether the model checks one token or a dozen, so most of the machine's effort is waiting for memory.

**{term('Speculative decoding')}** uses that slack: guess several next tokens (a *draft*), let the
model check them all in one pass, keep the ones it agrees with. The model always has the last word, so the text
is exactly what it would have written alone — only faster when the guesses are good.

Below, every picture comes from real runs of the model on two small preset prompts: renaming a variable in a piece
of code (much of the answer is copied from the question: RACER's best case) and a one-line joke (new text: its
worst). We follow **one step** of the first run through RACER's seven stages — the same stages the Step inspector's
*Anatomy* view shows for any step of any run."""

TREE = f"""#### A draft is a tree, checked in one pass

RACER does not guess one continuation but a **{term('draft tree')}**: several candidates for the next token, and
candidates after each of those, all starting from the token the model has just fixed (the root, *x0*). The model
reads the whole tree in one forward pass and returns its own choice at every node. Starting from the root, we walk
down as long as a child is exactly what the model would have picked. That walk is the **{term('accepted path')}**
(thick black below). The model's choice after the last accepted node comes free as well: it becomes the next step's
root (the dotted box). **{term('MAT')}** counts the tokens one forward pass commits on average; plain decoding has
MAT 1."""

#: What each stage does in general; the walk adds what it did at the preset's step.
STAGE_INTROS: dict[str, str] = {
    "match": f"""#### 1 · Where are we? The match state and the borders

Text repeats itself: names, code lines, phrases from the question. RACER keeps every stretch of up to 10 tokens of
the prompt and of its own answer in an **{term('automaton')}** (an Aho–Corasick trie). The step starts by appending
x0 to what the automaton matched so far, following **{term('failure link')}s** (each jumps to the longest shorter
ending that is also stored) until x0 can follow. Every stored ending of the text + x0 is a **{term('border')}**.""",
    "retrieval": """#### 2 · What followed before: retrieval candidates

Below each border the automaton holds what came next the earlier times. Those continuations, pooled over the
borders and ranked by how often they occurred, are the **retrieval** candidates (blue).""",
    "logits": f"""#### 3 · What the model predicted before: the logits tree

When nothing repeats, the model's own earlier predictions still help. Every forward pass ranks the next tokens;
RACER keeps the top 8 for each token it has seen (**{term('copy-logit')}**: the ranking from the last time *this*
token was fed). The logits tree (orange) copies x0's row, then the rows of those tokens, layer by layer: the best
entry gets the widest subtree, the next ones half as wide. A token the text never held has no row; RACER Studio then
reads its **cold row** (the model's top 8 after that token alone, computed once per model), a weaker guess that the
sizer learns to trust only as far as it holds.""",
    "merge": f"""#### 4 · One tree: prompt lookup, the merge and the sizer

RACER Studio also adds a **{term('prompt lookup')}** chain (purple): the text after an earlier occurrence of the last
few tokens (of their latest few, the one whose text agrees furthest back), which can run longer than the automaton's
10-token window. All candidates go into one trie;
paths that two sources proposed merge (green, *both*). Then the **{term('sizer')}** keeps only the candidates worth
their cost on this machine: it estimates how likely each is to be accepted and stops where the expected tokens per
second peak.""",
    "attention": f"""#### 5 · One forward pass: tree attention

The kept tree goes through the model in one forward pass. **{term('tree attention')}** makes that possible: each
node may look at the whole context and at its own ancestors, never at other branches, so every branch is scored as
if it were the only continuation.""",
    "verify": """#### 6 · Verify: keep what the model agrees with

The forward returns the model's own choice after every node. From x0 we walk down while a child is exactly that
choice. Where the walk stops, the model's choice is not lost: it is the next step's root. So every step commits at
least one token, and the text is exactly the model's own.""",
    "update": f"""#### 7 · Update: what the step teaches the drafter

The committed tokens are fed to the automaton (new n-grams, touched nodes; when it is full, the least recently
used leaves are evicted: {term('LRU eviction')}), and the copy-logit rows of every verified token are rewritten
from this forward's predictions. The next step drafts from there.""",
}

SOURCES = """#### Where each committed token came from, in both runs

Each bar is one step: grey is the model's own token (one per step), the colours are accepted drafts by source.
On the code (first chart) long copied stretches are accepted in one step; on the joke (second) almost every step
commits only the model's own token."""

COST = """#### Why the tree size depends on your hardware

Checking a bigger tree accepts more tokens, but the forward pass gets slower — a little on a GPU, a lot on a small
CPU. The best size is where *expected tokens per second* peaks, and that point moves with the machine. RACER Studio
measures this curve for the hardware it runs on (the Benchmark view shows it); with **capacity = auto**, RACER picks
the size at every step from it (stage 4 above)."""

LIMITS = """#### Where RACER cannot help

When the answer is short and new — a joke, a haiku, a list of fresh ideas — there is little to copy, and the
model's earlier predictions rarely match. Drafts are then mostly rejected and the speed is close to plain decoding
(never wrong, though: the model still checks every token). A small model may also fall into repeating itself;
RACER then copies the repetition and looks fast on it. Try both kinds of example in the Race view."""


@dataclass
class Preset:
    win: Any                   # racer_app.session.Trace: where RACER wins
    cannot: Any                # racer_app.session.Trace: where it cannot
    step: int                  # the step of `win` the walk follows (`pick_step`)
    live: bool = True          # made with the loaded model (else: the shipped traces)

    @property
    def trace(self) -> Any:
        return self.win


_cache: dict[str, Preset] = {}
_lock = threading.Lock()


def _count(s: Any, sources: tuple[str, ...]) -> int:
    acc = s.accepted[1:len(s.committed)]
    return sum(1 for i in acc if s.tree.sources[i] in sources)


def pick_step(steps: list[Any]) -> int:
    """The step the walk follows, for the tree section and the stages alike (so nothing is seen
    out of order): one that shows every stage well (borders, logits candidates, accepted copied
    drafts), else the earliest."""
    fw = [i for i, s in enumerate(steps) if s.forwarded] or [0]

    def richness(i: int) -> tuple:
        info = steps[i].info or {}
        return (bool(info.get("borders")), int(info.get("n_logits", 0) or 0) + int(info.get("n_both", 0) or 0) > 0,
                min(_count(steps[i], ("retrieval", "both", "lookup")), 4), len(steps[i].committed) > 1, -i)
    return max(fw, key=richness)


def get_preset(key: str) -> Preset | None:
    return _cache.get(key)


def put_preset(key: str, preset: Preset) -> None:
    with _lock:
        _cache[key] = preset
