"""Every linear kernel computes what nn.Linear computes, for every row count and layout."""
from __future__ import annotations

import random

import pytest
import torch
from torch import nn
from transformers import DynamicCache

from racer.fastlinear import (KERNELS, MAX_ROWS, PackedLinear, SmallBatchLinear, choose, kernel_of,
                              packed_available, use_kernel)
from racer.verify import forward_tree
from tests.test_loop_tiny import rand_prompt, random_tree
from tests.tiny import tiny_lm

FAST = [k for k in KERNELS if k != "stock" and (k != "packed" or packed_available(torch.float32))]
CLS = {"packed": PackedLinear, "small-batch": SmallBatchLinear}


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
    assert choose(cpu, torch.float32) == ("packed" if packed_available(torch.float32) else "small-batch")
    assert choose(cpu, torch.bfloat16) == "stock"
    assert choose(torch.device("cuda"), torch.float32) == "stock"
