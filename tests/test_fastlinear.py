"""The small-batch linear kernel computes what nn.Linear computes, for every row count."""
from __future__ import annotations

import random

import pytest
import torch
from torch import nn
from transformers import DynamicCache

from racer.fastlinear import MAX_ROWS, SmallBatchLinear, helps, use_small_batch_linear, use_stock_linear
from racer.verify import forward_tree
from tests.test_loop_tiny import rand_prompt, random_tree
from tests.tiny import tiny_lm


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 17, MAX_ROWS, MAX_ROWS + 1, 100])
def test_matches_nn_linear(bias, rows):
    torch.manual_seed(rows)
    ref = nn.Linear(48, 80, bias=bias)
    fast = nn.Linear(48, 80, bias=bias)
    fast.load_state_dict(ref.state_dict())
    assert use_small_batch_linear(fast) == 1 and type(fast) is SmallBatchLinear
    x = torch.randn(1, rows, 48)
    with torch.inference_mode():
        y, want = fast(x), ref(x)
    assert y.shape == want.shape == (1, rows, 80) and y.is_contiguous()
    assert torch.allclose(y, want, atol=1e-5)


def test_batched_input_and_grad_path():
    torch.manual_seed(0)
    lin = nn.Linear(16, 24)
    ref = lin(torch.ones(1, 1, 16)).detach()
    use_small_batch_linear(lin)
    x = torch.randn(3, 4, 16)
    with torch.inference_mode():
        assert torch.allclose(lin(x), x @ lin.weight.T + lin.bias, atol=1e-5)
    # With autograd on, the stock path runs, so gradients still flow.
    x.requires_grad_(True)
    lin(x).sum().backward()
    assert x.grad is not None
    assert torch.allclose(lin(torch.ones(1, 1, 16)).detach(), ref)


def test_swap_keeps_parameters_and_tied_weights():
    lm = tiny_lm(small_batch_linear=False)
    before = {k: v.clone() for k, v in lm.model.state_dict().items()}
    n = use_small_batch_linear(lm.model)
    assert n == sum(1 for m in lm.model.modules() if type(m) is SmallBatchLinear) > 0
    after = lm.model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert use_stock_linear(lm.model) == n
    assert not any(type(m) is SmallBatchLinear for m in lm.model.modules())


def test_tree_logits_same_with_either_kernel():
    lm = tiny_lm(small_batch_linear=False)
    rng = random.Random(3)
    prompt = rand_prompt(rng, 15)
    outs = []
    with torch.inference_mode():
        for swap in (use_stock_linear, use_small_batch_linear):
            swap(lm.model)
            cache = DynamicCache(config=lm.model.config)
            lm.model(input_ids=torch.tensor([prompt]), cache=cache, use_cache=True)
            tree = random_tree(random.Random(4), 7, 24, lm.vocab_size)
            outs.append(forward_tree(lm.model, cache, tree, len(prompt), lm.device, lm.dtype))
    assert torch.allclose(outs[0], outs[1], atol=1e-4)


def test_on_only_where_measured_faster():
    cpu = torch.device("cpu")
    assert helps(cpu, torch.float32)
    assert not helps(cpu, torch.bfloat16)
    assert not helps(torch.device("cuda"), torch.float32)
