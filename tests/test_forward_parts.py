"""scripts/forward_parts.py: a verify forward split into its parts, on a tiny model running racer's
fast layers; the wrappers must catch every part and leave the model as it found it."""
from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import pytest
import torch

from racer.cpu import layers
from racer.cpu.linear import tiled_available
from racer.tiny import tiny_lm
from racer.verify import forward_tree
from racer.costcurve import random_tree

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import forward_parts  # noqa: E402 - a script, not a package

pytestmark = pytest.mark.skipif(not tiled_available(), reason="racer's CPU kernels do not build here")


def _logits(lm, tree, prompt):
    from racer.kvcache import new_cache
    cache = new_cache(lm.model)
    with torch.inference_mode():
        lm.model(input_ids=torch.tensor([prompt]), cache=cache, use_cache=True)
        return forward_tree(lm.model, cache, tree, len(prompt), lm.device, lm.dtype, lm.layout)


def test_every_part_is_timed_and_everything_is_put_back():
    import random

    lm = tiny_lm(layers=3)
    plans = layers.plans(lm.model)
    assert len(plans) == 3
    before = [(p.ops, p.linear) for p in plans]
    tree = random_tree(random.Random(1), 6, lm.vocab_size)
    prompt = list(range(1, 20))
    want = _logits(lm, tree, prompt)
    acc: dict[str, float] = defaultdict(float)
    with forward_parts.timed_parts(lm, acc):
        got = _logits(lm, tree, prompt)
    # The wrapped forward computes the same logits, and every part but the rest was seen.
    assert torch.equal(got, want)
    for part in forward_parts.PARTS[:-1]:
        assert acc[part] > 0, part
    assert [(p.ops, p.linear) for p in plans] == before
    assert "forward" not in lm.model.lm_head.__dict__ and "forward" not in lm.model.model.norm.__dict__
    # Put back on an error too.
    with pytest.raises(RuntimeError):
        with forward_parts.timed_parts(lm, acc):
            raise RuntimeError("boom")
    assert [(p.ops, p.linear) for p in plans] == before


def test_measure_reports_each_size_and_parts_within_the_forward():
    lm = tiny_lm(layers=2)
    med = forward_parts.measure(lm, [1, 4], context=24, repeats=3)
    assert set(med) == {1, 4}
    for T, m in med.items():
        parts = sum(m[p] for p in forward_parts.PARTS[:-1])
        assert 0 < parts < m["instrumented"] and m["forward"] > 0
    text = forward_parts.table(med, [1, 4])
    assert "| linear products |" in text and "T = 4 less T = 1" in text


def test_a_model_without_racer_layers_is_refused():
    lm = tiny_lm(family="gemma2")
    with pytest.raises(SystemExit, match="no racer decoder layers"):
        with forward_parts.timed_parts(lm, defaultdict(float)):
            pass
