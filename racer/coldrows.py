"""Cold rows: for every token id, the model's top-K next tokens after that token alone.

A copy-logit row exists only for a token the context has fed (RACER's "unseen" signal is the
logits after the token's last occurrence). A token the text has never held, a name or a word
new to the conversation, has no row, so the step it roots drafts nothing and its forward
commits one token. Those steps are many: on Spec-Bench (10 questions per category, 256 tokens,
SmolLM2-135M, `racer`) 40 % of the verification steps had such a root.

A cold row is what the model predicts after the token with nothing before it but its own
assistant-turn opener (the chat template's, else the beginning of text): computed once per
model, for every token, as a batch of single-token continuations of that shared prefix. It is a
poor guess next to a real row (measured on those roots: the next token was its first entry
17.8 % of the time, within its first two 25 %, its first four 34 %, its eight 45 %; without the
opener, its first entry 0.5 %), but the forward that carries it costs next to nothing more at
such a step (2-4 nodes: under 2 % of a forward on the 2-core CPUs), and tree sizing learns how
often it holds like any other source. Only a root without a real row reads its cold row
(`CopyLogitStore.expand`); the nodes below follow the real rows of their own tokens.

Computing them takes a forward over the whole vocabulary (about a minute for SmolLM2-135M in
bfloat16 on a 2-core AVX512-BF16 CPU), so they are kept on disk like the cost curve and, in one
process, on the model (`lm.cold_rows`). The decode loop hands them to a drafter only once
`get_cold_rows(lm)` has made them (the app's warm-up, the benchmark and the CLI do): nothing
blocks a decode for a minute unasked. Vocabularies above `MAX_ROWS` get rows for their first
`MAX_ROWS` ids only (the cost grows with vocabulary size twice: rows and their projections).
"""
from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from .models import LoadedModel
from .paths import keyed_file
from .prompting import build_input_ids

#: Rows computed per model at most (the first ids of the vocabulary).
MAX_ROWS = 65_536
#: Entries per row (the copy-logit store's width).
K = 8
#: Tokens per batched forward (about 1.5 s for the default model in bfloat16 on 2 cores).
BATCH = 1024


@dataclass
class ColdRows:
    """(rows, K) next-token ids and their probabilities, row `t` for token id `t`."""
    tokens: np.ndarray
    probs: np.ndarray
    key: dict[str, Any]
    seconds: float = 0.0
    _lists: dict[int, tuple[list[int], list[float]]] = field(default_factory=dict, repr=False, compare=False)

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def row(self, token: int, k: int) -> tuple[list[int], list[float]]:
        """The first `k` entries of `token`'s row and their probabilities ([] for an id without one)."""
        got = self._lists.get(token)
        if got is None:
            if 0 <= token < len(self):
                got = (self.tokens[token].tolist(), self.probs[token].tolist())
            else:
                got = ([], [])
            self._lists[token] = got
        return got[0][:k], got[1][:k]


def opener(lm: LoadedModel) -> list[int]:
    """The ids every cold row's token follows: an empty user turn and the assistant's opener
    (chat models), else the model's beginning-of-text token, else a newline."""
    tok = lm.tokenizer
    if lm.chat:
        return build_input_ids(tok, "")
    bos = getattr(tok, "bos_token_id", None)
    if bos is None:
        bos = getattr(lm.model.config, "bos_token_id", None)
    if isinstance(bos, int):
        return [bos]
    return tok.encode("\n", add_special_tokens=False)[:1] if hasattr(tok, "encode") else [0]


def rows_key(lm: LoadedModel, k: int = K, max_rows: int = MAX_ROWS) -> dict[str, Any]:
    # Not the dtype or the device: rows from a bfloat16 and a float32 forward differ at near
    # ties only, and drafts never change an output.
    return {"format": "1", "model": lm.name, "spec": lm.spec, "vocab": int(lm.vocab_size),
            "opener": opener(lm), "k": int(k), "rows": int(min(lm.vocab_size, max_rows))}


def _cache_file(key: dict[str, Any]) -> Path:
    return keyed_file("coldrows", key, ".npz")


def compute(lm: LoadedModel, k: int = K, max_rows: int = MAX_ROWS, batch: int = BATCH,
            progress: Callable[[str], None] | None = None,
            call: Callable[[Callable[[], None]], Any] | None = None) -> ColdRows:
    """Every row, as batches of one token after the shared opener's cached keys and values.
    `call(fn)` runs each batch (the app passes its decode slot's, so a visitor's decode waits
    for one batch at most, not for the whole table)."""
    from transformers import DynamicCache
    t0 = time.perf_counter()
    model, device = lm.model, lm.device
    pre = opener(lm)
    n = int(min(lm.vocab_size, max_rows))
    k = min(k, int(lm.vocab_size))
    shared = DynamicCache(config=model.config)
    tokens = np.empty((n, k), dtype=np.int32)
    probs = np.empty((n, k), dtype=np.float32)

    @torch.inference_mode()
    def opener_cache() -> None:
        model(input_ids=torch.tensor([pre], device=device), cache=shared, use_cache=True, logits_to_keep=1)

    def rows(s: int) -> Callable[[], None]:
        @torch.inference_mode()
        def run() -> None:
            ids = torch.arange(s, min(n, s + batch), device=device)
            cache = copy.deepcopy(shared)
            cache.batch_repeat_interleave(len(ids))
            logits = model(input_ids=ids[:, None], cache=cache, use_cache=True, logits_to_keep=1,
                           position_ids=torch.full((len(ids), 1), len(pre), device=device)).logits[:, -1].float()
            top, idx = logits.topk(k, dim=-1)
            tokens[s:s + len(ids)] = idx.cpu().numpy()
            probs[s:s + len(ids)] = (top - torch.logsumexp(logits, dim=-1, keepdim=True)).exp().cpu().numpy()
        return run

    run_ = call or (lambda fn: fn())
    run_(opener_cache)
    for s in range(0, n, batch):
        run_(rows(s))
        if progress is not None:
            progress(f"cold rows {min(n, s + batch):,} of {n:,}")
    return ColdRows(tokens, probs, rows_key(lm, k, max_rows), time.perf_counter() - t0)


def load(key: dict[str, Any]) -> ColdRows | None:
    """The rows cached on this machine under `key`, or None."""
    path = _cache_file(key)
    if not path.is_file():
        return None
    try:
        with np.load(path) as d:
            if json.loads(str(d["key"])) != key:
                return None
            return ColdRows(d["tokens"], d["probs"], key, float(d["seconds"]))
    except (OSError, ValueError, KeyError):
        return None


def get_cold_rows(lm: LoadedModel, progress: Callable[[str], None] | None = None,
                  call: Callable[[Callable[[], None]], Any] | None = None, make: bool = True) -> ColdRows | None:
    """This model's cold rows: kept on `lm.cold_rows`, else from the disk cache, else computed
    (about a minute for the default model on a 2-core CPU; `call` as in `compute`) and cached.
    With `make=False`, None where they are not made yet (nothing is computed)."""
    if lm.cold_rows is not None:
        return lm.cold_rows
    key = rows_key(lm)
    rows = load(key)
    if rows is None and not make:
        return None
    if rows is None:
        rows = compute(lm, progress=progress, call=call)
        path = _cache_file(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp.npz")
            np.savez(tmp, tokens=rows.tokens, probs=rows.probs, key=json.dumps(key, sort_keys=True),
                     seconds=rows.seconds)
            tmp.replace(path)
        except OSError:
            pass  # a read-only cache only costs computing them again next start
    lm.cold_rows = rows
    return rows
