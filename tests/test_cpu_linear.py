"""Every linear kernel computes what nn.Linear computes, for every row count and layout."""
from __future__ import annotations

import random

import pytest
import torch
from torch import nn
from transformers import DynamicCache

from racer.cpu.build import extension
from racer.cpu.linear import (KERNELS, MAX_ROWS, TILED_MAX_ROWS, PackedLinear, SmallBatchLinear,
                              TiledLinear, choose, kernel_of, packed_available, tiled_available,
                              tiled_bf16_available, use_kernel)
from racer.verify import forward_tree
from tests.test_loop_tiny import rand_prompt, random_tree
from racer.tiny import tiny_lm

FAST = [k for k in KERNELS if k != "stock" and (k != "packed" or packed_available(torch.float32))
        and (k != "tiled" or tiled_available())]
CLS = {"tiled": TiledLinear, "packed": PackedLinear, "small-batch": SmallBatchLinear}
needs_tiled = pytest.mark.skipif(not tiled_available(), reason="tiled kernel not built here (no AVX2 or no compiler)")
needs_tiled_bf16 = pytest.mark.skipif(not tiled_bf16_available(),
                                      reason="bfloat16 tiled kernel needs a CPU with AVX512-BF16")


@pytest.mark.parametrize("kernel", FAST)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 17, MAX_ROWS, MAX_ROWS + 1, 100])
def test_matches_nn_linear(kernel, bias, rows):
    torch.manual_seed(rows)
    ref = nn.Linear(48, 80, bias=bias)
    fast = nn.Linear(48, 80, bias=bias)
    fast.load_state_dict(ref.state_dict())
    assert use_kernel(fast, kernel) == 1 and type(fast) is CLS[kernel] and kernel_of(fast) == kernel
    x = torch.randn(1, rows, 48)
    with torch.inference_mode():
        y, want = fast(x), ref(x)
    assert y.shape == want.shape == (1, rows, 80) and y.is_contiguous()
    assert torch.allclose(y, want, atol=1e-5)


@pytest.mark.parametrize("kernel", FAST)
def test_batched_input_and_grad_path(kernel):
    torch.manual_seed(0)
    lin = nn.Linear(16, 24)
    ref = lin(torch.ones(1, 1, 16)).detach()
    use_kernel(lin, kernel)
    x = torch.randn(3, 4, 16)
    with torch.inference_mode():
        assert torch.allclose(lin(x), x @ lin.weight.T + lin.bias, atol=1e-5)
        assert lin(torch.randn(0, 16)).shape == (0, 24)
    # With autograd on, the stock path runs, so gradients still flow.
    x.requires_grad_(True)
    lin(x).sum().backward()
    assert x.grad is not None
    assert torch.allclose(lin(torch.ones(1, 1, 16)).detach(), ref)


@pytest.mark.skipif("packed" not in FAST, reason="oneDNN packed linear not available here")
def test_packed_follows_weight_changes():
    torch.manual_seed(1)
    lin = nn.Linear(32, 40)
    use_kernel(lin, "packed")
    x = torch.randn(5, 32)
    with torch.inference_mode():
        before = lin(x)
    with torch.no_grad():
        lin.weight.mul_(2.0)  # in place: the reordered copy must not go stale
    with torch.inference_mode():
        assert torch.allclose(lin(x), x @ lin.weight.T + lin.bias, atol=1e-5)
        assert not torch.allclose(lin(x), before)
    lin.load_state_dict({"weight": torch.zeros(40, 32), "bias": torch.ones(40)})
    with torch.inference_mode():
        assert torch.equal(lin(x), torch.ones(5, 40))
    use_kernel(lin, "stock")
    assert type(lin) is nn.Linear and "_racer_packed" not in lin.__dict__


def test_swap_keeps_parameters_and_tied_weights():
    lm = tiny_lm(kernel="stock")
    before = {k: v.clone() for k, v in lm.model.state_dict().items()}
    for kernel in FAST:
        n = use_kernel(lm.model, kernel)
        assert n == sum(1 for m in lm.model.modules() if type(m) is CLS[kernel]) > 0
        after = lm.model.state_dict()
        assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
        assert use_kernel(lm.model, "stock") == n and kernel_of(lm.model) == "stock"
        assert not any(type(m) in CLS.values() for m in lm.model.modules())
    with pytest.raises(ValueError, match="unknown linear kernel"):
        use_kernel(lm.model, "fast")


def test_tree_logits_same_with_every_kernel():
    lm = tiny_lm(kernel="stock")
    rng = random.Random(3)
    prompt = rand_prompt(rng, 15)
    outs = []
    with torch.inference_mode():
        for kernel in ["stock", *FAST]:
            use_kernel(lm.model, kernel)
            cache = DynamicCache(config=lm.model.config)
            lm.model(input_ids=torch.tensor([prompt]), cache=cache, use_cache=True)
            tree = random_tree(random.Random(4), 7, 24, lm.vocab_size)
            outs.append(forward_tree(lm.model, cache, tree, len(prompt), lm.device, lm.dtype))
    assert all(torch.allclose(outs[0], o, atol=1e-4) for o in outs[1:])


def test_chosen_only_where_measured_faster():
    cpu = torch.device("cpu")
    want = "tiled" if tiled_available() else "packed" if packed_available(torch.float32) else "small-batch"
    assert choose(cpu, torch.float32) == want
    assert choose(cpu, torch.bfloat16) == ("tiled" if tiled_bf16_available() else "stock")
    assert choose(cpu, torch.float16) == "stock"
    assert choose(torch.device("cuda"), torch.float32) == "stock"


@needs_tiled
@pytest.mark.parametrize("k_in,n_out", [(1, 1), (7, 5), (13, 40), (48, 80), (65, 3), (576, 193), (701, 37)])
def test_tiled_matches_linear_on_odd_shapes(k_in, n_out):
    # Widths that are not multiples of the 8-float vector or of the 3-row weight tile take the
    # kernel's tail paths.
    ops = extension()
    torch.manual_seed(k_in * 1000 + n_out)
    w, b = torch.randn(n_out, k_in), torch.randn(n_out)
    for rows in range(1, TILED_MAX_ROWS + 1):
        x = torch.randn(rows, k_in)
        want = torch.nn.functional.linear(x.double(), w.double(), b.double()).float()
        assert torch.allclose(ops.tiled_linear(x, w, b), want, atol=1e-4, rtol=1e-4)
        assert torch.allclose(ops.tiled_linear(x, w, None), want - b, atol=1e-4, rtol=1e-4)


@needs_tiled
@pytest.mark.parametrize("k_in", [200, 700])
def test_tiled_rows_do_not_depend_on_the_batch(k_in):
    # A row's result is bit-identical whether it is computed alone or among 2..TILED_MAX_ROWS rows, at any
    # position: the per-output summation order is fixed. From 5 rows a block runs tile by tile up to
    # K = 640 and pass by pass above (csrc/tiled_linear.cpp): both widths.
    ops = extension()
    torch.manual_seed(7)
    w = torch.randn(97, k_in)
    x = torch.randn(TILED_MAX_ROWS, k_in)
    alone = torch.cat([ops.tiled_linear(x[i:i + 1], w, None) for i in range(TILED_MAX_ROWS)])
    for rows in range(2, TILED_MAX_ROWS + 1):
        assert torch.equal(ops.tiled_linear(x[:rows], w, None), alone[:rows])
    assert torch.equal(ops.tiled_linear(x[5:11], w, None), alone[5:11])


@needs_tiled
def test_tiled_rejects_what_it_cannot_compute():
    ops = extension()
    with pytest.raises(RuntimeError, match="float32"):
        ops.tiled_linear(torch.ones(2, 4, dtype=torch.float64), torch.ones(3, 4, dtype=torch.float64), None)
    with pytest.raises(RuntimeError, match="last dimension"):
        ops.tiled_linear(torch.ones(2, 5), torch.ones(3, 4), None)
    assert ops.tiled_linear(torch.ones(0, 4), torch.ones(3, 4), None).shape == (0, 3)


@needs_tiled
def test_tiled_hands_large_products_to_onednn():
    # Over TILED_MAX_ROWS rows (prefill) the packed path runs; up to it every linear, the
    # vocabulary-wide projection included, runs tiled and still matches nn.Linear.
    torch.manual_seed(2)
    wide = nn.Linear(16, 49153)
    ref = nn.Linear(16, 49153)
    ref.load_state_dict(wide.state_dict())
    use_kernel(wide, "tiled")
    calls = []
    real = extension().tiled_linear

    class Spy:
        def tiled_linear(self, *a):
            calls.append(a[0].shape)
            return real(*a)
    import racer.cpu.linear as fl
    saved = fl.extension
    narrow = nn.Linear(16, 8)
    use_kernel(narrow, "tiled")
    fl.extension = lambda: Spy()
    try:
        with torch.inference_mode():
            narrow(torch.randn(TILED_MAX_ROWS + 1, 16))
            assert calls == []
            narrow(torch.randn(TILED_MAX_ROWS, 16))
            assert calls == [(TILED_MAX_ROWS, 16)]
            x = torch.randn(1, 3, 16)
            assert torch.allclose(wide(x), ref(x), atol=1e-5)
            assert calls[-1] == (1, 3, 16)
            n = len(calls)
            xs = torch.randn(TILED_MAX_ROWS + 1, 16)
            assert torch.allclose(wide(xs), ref(xs), atol=1e-5)
            assert len(calls) == n
    finally:
        fl.extension = saved


def bf16_reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """The exact product of the bf16 operands (float64), before the output's bf16 rounding."""
    y = x.double() @ w.double().T
    return y + b.double() if b is not None else y


def packed_bf16(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    ops = extension()
    return ops.packed_linear_bf16(x, ops.pack_bf16(w), w.shape[0], b)


@needs_tiled_bf16
@pytest.mark.parametrize("k_in,n_out", [(1, 1), (7, 5), (31, 13), (33, 40), (64, 3), (576, 193)])
def test_bf16_kernel_matches_the_exact_product(k_in, n_out):
    # Odd widths (padded to a pair) and output counts off the 16-lane block and the 3-block tile
    # take the tail paths. The kernel sums in float32 and rounds once: within a bf16 rounding of
    # the exact result.
    torch.manual_seed(k_in * 1000 + n_out)
    w, b = torch.randn(n_out, k_in).bfloat16(), torch.randn(n_out).bfloat16()
    # Every tile shape (1..8 rows a pass, then 8-row passes and a tail), a sample above, a prefill.
    for rows in [*range(1, 18), *range(18, TILED_MAX_ROWS + 1, 5), 300]:
        x = torch.randn(rows, k_in).bfloat16()
        for bias in (b, None):
            got = packed_bf16(x, w, bias)
            assert got.dtype == torch.bfloat16 and got.shape == (rows, n_out)
            want = bf16_reference(x, w, bias)
            assert torch.all((got.double() - want).abs() <= want.abs() * 2 ** -8 + 1e-4 * k_in)


@needs_tiled_bf16
def test_bf16_rows_do_not_depend_on_the_batch_or_on_where_the_output_sits():
    ops = extension()
    torch.manual_seed(1)
    x, w = torch.randn(TILED_MAX_ROWS + 9, 576).bfloat16(), torch.randn(200, 576).bfloat16()
    pw = ops.pack_bf16(w)
    alone = torch.cat([ops.packed_linear_bf16(x[i:i + 1], pw, 200, None) for i in range(len(x))])
    for rows in range(2, len(x) + 1):
        assert torch.equal(ops.packed_linear_bf16(x[:rows], pw, 200, None), alone[:rows])
    # Outputs 37.. of a weight (off the 16-lane blocks) equal the same rows of W packed alone: fused
    # weights (q/k/v in one) give the bits of separate ones.
    assert torch.equal(packed_bf16(x[:11], w[37:], None), alone[:11, 37:])


@needs_tiled_bf16
def test_bf16_layer_matches_nn_linear_follows_its_weight_and_refuses_float32():
    torch.manual_seed(2)
    ref = nn.Linear(96, 50).bfloat16()
    fast = nn.Linear(96, 50).bfloat16()
    fast.load_state_dict(ref.state_dict())
    use_kernel(fast, "tiled")
    assert type(fast) is TiledLinear
    with torch.inference_mode():
        for rows in (1, 4, 7, TILED_MAX_ROWS + 3):
            x = torch.randn(2, rows, 96).bfloat16()
            assert torch.allclose(fast(x).float(), ref(x).float(), atol=3e-2, rtol=2e-2)
    # A weight written in place is packed again before its next product.
    with torch.no_grad():
        fast.weight.mul_(-2)
        ref.weight.mul_(-2)
    with torch.inference_mode():
        x = torch.randn(3, 96).bfloat16()
        assert torch.allclose(fast(x).float(), ref(x).float(), atol=3e-2, rtol=2e-2)
    with pytest.raises(RuntimeError, match="bfloat16"):
        extension().packed_linear_bf16(torch.ones(2, 4), extension().pack_bf16(torch.ones(3, 4).bfloat16()), 3, None)
    with pytest.raises(RuntimeError, match="n_out"):
        extension().packed_linear_bf16(torch.ones(2, 4).bfloat16(), extension().pack_bf16(torch.ones(3, 4).bfloat16()),
                                       40, None)


@needs_tiled_bf16
def test_bf16_switches_keep_only_the_copy_in_use_unless_asked():
    lin = nn.Linear(32, 20).bfloat16()
    use_kernel(lin, "tiled")
    assert "_racer_bf16" in lin.__dict__ and "_racer_packed" not in lin.__dict__
    use_kernel(lin, "packed")
    assert "_racer_packed" in lin.__dict__ and "_racer_bf16" not in lin.__dict__
    use_kernel(lin, "tiled", keep_packed=True)  # A/B timing: both stay, neither is made again
    kept = lin.__dict__["_racer_packed"], lin.__dict__["_racer_bf16"]
    use_kernel(lin, "packed", keep_packed=True)
    use_kernel(lin, "tiled", keep_packed=True)
    assert lin.__dict__["_racer_packed"] is kept[0] and lin.__dict__["_racer_bf16"] is kept[1]
    use_kernel(lin, "stock")
    assert not {"_racer_packed", "_racer_bf16"} & lin.__dict__.keys()
