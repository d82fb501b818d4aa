"""racer.cpu.norm: the RMSNorm kernel computes what the Llama-family module computes."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from racer.cpu import norm
from racer.cpu.build import extension
from racer.tiny import tiny_lm

native = pytest.mark.skipif(extension() is None, reason="racer's kernels are not built here (no AVX2 or compiler)")


def pair(dtype: torch.dtype, hidden: int = 576) -> tuple[nn.Module, nn.Module]:
    ref = LlamaRMSNorm(hidden, eps=1e-5).to(dtype)
    with torch.no_grad():
        ref.weight.normal_()
    fast = LlamaRMSNorm(hidden, eps=1e-5).to(dtype)
    fast.load_state_dict(ref.state_dict())
    holder = nn.Sequential(fast)
    assert norm.use_fast_norm(holder) == 1 and type(holder[0]) is norm.FastRMSNorm
    return ref, holder[0]


@native
@pytest.mark.parametrize("hidden", [576, 17, 64])
@pytest.mark.parametrize("rows", [1, 5, 64])
def test_bf16_matches_the_module(hidden, rows):
    torch.manual_seed(hidden * rows)
    ref, fast = pair(torch.bfloat16, hidden)
    x = (torch.randn(1, rows, hidden) * 4).bfloat16()
    with torch.inference_mode():
        got, want = fast(x).float(), ref(x).float()
    # The same rounding steps; only the float32 sum of squares may differ in its last bit (PyTorch's
    # reduction order), which can move an output by one bf16 step.
    assert torch.allclose(got, want, rtol=2 ** -7, atol=0)
    assert (got == want).float().mean() > 0.95


@native
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 5, 300])
def test_matches_and_rows_do_not_depend_on_the_batch(dtype, rows):
    torch.manual_seed(rows)
    ref, fast = pair(dtype)
    x = (torch.randn(rows, 576) * 3).to(dtype)
    with torch.inference_mode():
        got = fast(x)
        assert torch.allclose(got.float(), ref(x).float(), rtol=1e-6 if dtype == torch.float32 else 2 ** -7, atol=1e-6)
        alone = torch.cat([fast(x[i:i + 1]) for i in range(rows)])
    assert torch.equal(got, alone)


def test_autograd_and_other_dtypes_run_the_formula():
    ref, fast = pair(torch.float32) if extension() is not None else (None, None)
    if ref is None:
        pytest.skip("kernel not built")
    x = torch.randn(3, 576, requires_grad=True)
    y = fast(x)
    y.sum().backward()
    assert x.grad is not None and torch.allclose(y, ref(x))
    h = torch.randn(2, 576).half()
    assert torch.allclose(fast.half()(h).float(), ref.half()(h).float(), atol=1e-2)


@native
def test_models_get_it_and_only_for_known_formulas():
    lm = tiny_lm()
    norms = [m for m in lm.model.modules() if "RMSNorm" in type(m).__name__]
    assert norms and all(type(m) is norm.FastRMSNorm for m in norms)
    assert all(type(m).__name__ == "LlamaRMSNorm" for m in tiny_lm(kernel="stock").model.modules()
               if "RMSNorm" in type(m).__name__)

    class GemmaLike(nn.Module):  # 1 + w: another formula, left alone
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.zeros(8))
            self.variance_epsilon = 1e-6
    assert norm.use_fast_norm(nn.Sequential(GemmaLike())) == 0
