"""racer.cpu.rows: the loop's per-row argmax and top-k, by racer's kernel where built, agree
with PyTorch's definitions."""
from __future__ import annotations

import pytest
import torch

from racer.cpu.rows import argmax, top_k, top_k_leads_with_argmax
from racer.cpu.build import extension

native = pytest.mark.skipif(extension() is None, reason="racer's kernels are not built here (no AVX2 or compiler)")
DTYPES = [torch.float32, torch.bfloat16]


def logits_with_ties(rows: int, vocab: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, vocab, generator=g) * 3).to(dtype)
    # Exact ties for the maximum and inside the top k, in bf16 common at these magnitudes.
    x[0, vocab // 3] = x[0, vocab - 2] = x[0].max() + 1
    x[-1, 5] = x[-1, 9] = x[-1].max() + 1
    x[-1, 7] = x[-1, 5]
    return x


@native
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", [1, 7, 8, 49_152, 50_001])
def test_argmax_is_torch_argmax(dtype, vocab):
    x = logits_with_ties(6, vocab, dtype, vocab) if vocab > 10 else torch.randn(6, vocab).to(dtype)
    assert torch.equal(argmax(x), x.argmax(dim=-1))


@native
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [1, 4, 10])
def test_top_k_ids_and_probabilities(dtype, k):
    x = logits_with_ties(5, 50_001, dtype, k)
    ids, p = top_k(x, k, True)
    assert ids.shape == p.shape == (5, k)
    xf = x.float()
    values, _ = xf.topk(k, dim=-1)
    got = torch.gather(xf, 1, torch.from_numpy(ids))
    assert torch.equal(got, values)  # the k largest, most likely first
    for r in range(5):  # ties: lower id first
        for j in range(k - 1):
            assert got[r, j] > got[r, j + 1] or ids[r, j] < ids[r, j + 1]
    want = (values - xf.logsumexp(dim=-1, keepdim=True)).exp()
    assert torch.allclose(torch.from_numpy(p), want, rtol=1e-5, atol=1e-7)
    ids2, none = top_k(x, k, False)
    assert none is None and (ids2 == ids).all()


@native
@pytest.mark.parametrize("dtype", DTYPES)
def test_top_k_starts_with_the_argmax(dtype):
    """The greedy loop reads each row's argmax from its top-k (ties: the lower id), and the
    probabilities take the row's maximum from it: a padded vocabulary's -inf included."""
    x = logits_with_ties(6, 49_152, dtype, 3)
    x[2, 40_000:] = float("-inf")
    ids, p = top_k(x, 8, True)
    assert top_k_leads_with_argmax(x) and (torch.from_numpy(ids[:, 0]) == x.argmax(dim=-1)).all()
    xf = x.float()
    want = (xf.topk(8, dim=-1).values - xf.logsumexp(dim=-1, keepdim=True)).exp()
    assert torch.allclose(torch.from_numpy(p), want, rtol=1e-5, atol=1e-7)


@native
def test_many_rows_and_a_vocabulary_of_k():
    x = torch.randn(300, 12)
    ids, p = top_k(x, 12, True)
    assert (torch.from_numpy(ids).sort(dim=-1).values == torch.arange(12)).all()
    assert torch.allclose(torch.from_numpy(p).sum(-1), torch.ones(300), atol=1e-5)
    assert torch.equal(argmax(x), x.argmax(-1))


def test_other_dtypes_fall_back_to_torch():
    x = torch.randn(3, 40).half()
    assert not top_k_leads_with_argmax(x)  # torch.topk's ties: the loop reads argmax itself
    assert torch.equal(argmax(x), x.argmax(-1))
    ids, p = top_k(x, 3, True)
    assert (ids == x.topk(3, dim=-1).indices.numpy()).all() and p.shape == (3, 3)


@native
def test_kernel_rejects_what_it_cannot_compute():
    ops = extension()
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        ops.argmax_rows(torch.zeros(2, 3, dtype=torch.float16))
    with pytest.raises(RuntimeError, match="k must be"):
        ops.topk_rows(torch.zeros(2, 3), 4, False)
    with pytest.raises(RuntimeError, match="rows, vocabulary"):
        ops.argmax_rows(torch.zeros(3))
