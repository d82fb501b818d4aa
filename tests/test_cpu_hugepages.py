"""racer.cpu.hugepages: which tensors go onto 2 MiB pages, that the ranges asked for cover them,
and that moving them changes no output."""
from __future__ import annotations

import ctypes
import mmap
import sys

import pytest
import torch

from racer.cpu import hugepages, layers
from racer.cpu.build import extension
from racer.tiny import tiny_lm


def collapse_works() -> bool:
    """Whether this kernel moves anonymous memory onto 2 MiB pages when asked (Linux 6.1+, huge
    pages not switched off)."""
    if not sys.platform.startswith("linux"):
        return False
    buf = mmap.mmap(-1, 3 * hugepages.PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # what malloc gives
    buf.write(b"x" * len(buf))
    anchor = ctypes.c_char.from_buffer(buf)
    start = ctypes.addressof(anchor)
    page = (start + hugepages.PAGE - 1) // hugepages.PAGE * hugepages.PAGE
    madvise = hugepages._madvise()
    madvise(page, hugepages.PAGE, hugepages._MADV_HUGEPAGE)
    ok = madvise(page, hugepages.PAGE, hugepages._MADV_COLLAPSE) == 0
    del anchor
    buf.close()
    return ok


def test_page_ranges_are_whole_pages_that_cover_every_large_tensor_and_skip_small_ones():
    big = [torch.empty(n, dtype=torch.uint8) for n in (3 << 20, 5 << 20, 1 << 20)]
    small = torch.empty(1024, dtype=torch.uint8)
    ranges = hugepages.page_ranges(big + [big[0][10:], small])
    assert ranges == sorted(ranges)
    for (lo, hi), nxt in zip(ranges, ranges[1:] + [(None, None)]):
        assert lo % hugepages.PAGE == 0 and hi % hugepages.PAGE == 0 and lo < hi
        assert nxt[0] is None or hi < nxt[0]  # touching ranges are merged
    for t in big:
        a, n = t.data_ptr(), t.untyped_storage().nbytes()
        assert any(lo <= a and a + n <= hi for lo, hi in ranges)
    assert hugepages.page_ranges([small]) == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_streamed_tensors_are_what_the_kernels_multiply(dtype):
    lm = tiny_lm(dtype=dtype)
    got = {t.data_ptr() for t in hugepages.streamed_tensors(lm.model)}
    plans = layers.plans(lm.model)
    head = lm.model.get_output_embeddings()
    if extension() is None or not plans:
        # No plans: every linear layer's weight (or its kernel's copy) is what streams.
        assert head.__dict__.get("_racer_bf16", head.weight).data_ptr() in got
        return
    for p in plans:
        for w in (p.w_qkv, p.w_o, p.w_gu, p.w_down):
            assert (w[0] if isinstance(w, tuple) else w).data_ptr() in got
    if dtype == torch.bfloat16 and isinstance(plans[0].w_qkv, tuple):
        # The packed copies stream; the weights they were made from are never read.
        assert plans[0].linears[0].weight.data_ptr() not in got
    else:
        assert plans[0].w_o.data_ptr() == plans[0].linears[3].weight.data_ptr()


@pytest.mark.skipif(not collapse_works(), reason="this kernel does not move memory onto 2 MiB pages (MADV_COLLAPSE)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_moving_the_weights_onto_huge_pages_changes_no_output(dtype, monkeypatch):
    lm = tiny_lm(dtype=dtype)
    ids = torch.tensor([[1, 5, 9, 2, 7, 7, 3]])
    with torch.inference_mode():
        before = lm.model(input_ids=ids).logits
    monkeypatch.setattr(hugepages, "MIN_BYTES", 1)  # the tiny model's weights are small
    assert hugepages.back_model(lm.model) >= hugepages.PAGE
    with torch.inference_mode():
        after = lm.model(input_ids=ids).logits
    assert torch.equal(before, after)


def test_the_switch_turns_huge_pages_off(monkeypatch):
    monkeypatch.setenv("RACER_HUGE_PAGES", "0")
    monkeypatch.setattr(hugepages, "MIN_BYTES", 1)
    lm = tiny_lm()
    assert lm.model.__dict__["_racer_huge_pages"] == 0 and not any("2 MiB" in n for n in lm.notes)
    assert hugepages.back_model(lm.model) == 0
