"""racer's decoder-layer forward (racer.cpu.layers): bit-identical to the module path it replaces, for
one token, chains and trees, over both cache classes, in float32 and bfloat16, for Llama, Qwen2 and
Mistral layers; it leaves the module path whenever it cannot reproduce it."""
from __future__ import annotations

import random

import pytest
import torch
from transformers import DynamicCache, MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from racer.cpu import ON, attention, layers, linear, norm
from racer.cpu.build import extension
from racer.cpu.linear import tiled_available, tiled_bf16_available
from racer.kvcache import new_cache
from racer.verify import forward_tree
from tests.test_loop_tiny import random_tree
from racer.tiny import tiny_lm

pytestmark = pytest.mark.skipif(not tiled_available(), reason="racer's CPU kernels do not build here")

DTYPES = [torch.float32] + ([torch.bfloat16] if tiled_bf16_available() else [])


@pytest.fixture
def fast_on():
    yield
    ON.fast_layer = True


def both_paths(lm, run):
    """run() with the fast layer forward and with the module path."""
    ON.fast_layer = True
    fast = run()
    ON.fast_layer = False
    try:
        slow = run()
    finally:
        ON.fast_layer = True
    return fast, slow


def tree_logits(lm, prompt, tree, cache_cls=None):
    model = lm.model
    cache = new_cache(model) if cache_cls is None else cache_cls(config=model.config)
    with torch.inference_mode():
        model(input_ids=torch.tensor([prompt]), cache=cache, use_cache=True)
        out = forward_tree(model, cache, tree, len(prompt), lm.device, lm.dtype)
        # The cache the tree forward wrote is used by the next one as well.
        nxt = model(input_ids=torch.tensor([[tree.tokens[-1]]]), cache=cache, use_cache=True).logits[0]
    return torch.cat([out, nxt])


class Boom:
    @staticmethod
    def forward(*args, **kwargs):
        raise AssertionError("the module path ran")


def force_fast(lm):
    """Make the module path raise, so a test knows the fast forward ran."""
    for layer in lm.model.model.layers:
        layer.__dict__["_racer_base"] = Boom


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("size", [1, 2, 5, 8, 13, 64])
def test_tree_and_chain_logits_equal_module_path(dtype, size, fast_on):
    lm = tiny_lm(dtype=dtype, layers=3, head_dim=64 if dtype == torch.bfloat16 else None)
    assert layers.count(lm.model) == 3
    rng = random.Random(size)
    prompt = [rng.randrange(lm.vocab_size) for _ in range(40)]
    tree = random_tree(rng, 7, size, lm.vocab_size)
    fast, slow = both_paths(lm, lambda: tree_logits(lm, prompt, tree))
    assert torch.equal(fast, slow)
    chain = random_tree(random.Random(0), 3, 1, lm.vocab_size)
    for tok in range(size - 1):
        chain.add(len(chain) - 1, tok % lm.vocab_size, "retrieval", 0)
    fast, slow = both_paths(lm, lambda: tree_logits(lm, prompt, chain, DynamicCache))
    assert torch.equal(fast, slow)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fast_forward_runs_for_steps_and_not_for_float32_prefill_or_autograd(dtype, fast_on):
    lm = tiny_lm(dtype=dtype, layers=2)
    force_fast(lm)
    model = lm.model
    cache = new_cache(model)
    prefill = torch.arange(linear.TILED_MAX_ROWS + 1)[None] % lm.vocab_size
    with torch.inference_mode():
        if dtype == torch.float32:
            with pytest.raises(AssertionError, match="module path"):  # 65 rows: float32 prefill is the module's
                model(input_ids=prefill, cache=cache)
        else:
            model(input_ids=prefill, cache=cache)  # the bf16 kernel takes any number of rows
        model(input_ids=torch.tensor([[1, 2, 3]]), cache=cache)  # a step: the fast forward
    with torch.enable_grad(), pytest.raises(AssertionError, match="module path"):
        model(input_ids=torch.tensor([[1, 2, 3]]))
    ON.fast_layer = False
    with torch.inference_mode(), pytest.raises(AssertionError, match="module path"):
        model(input_ids=torch.tensor([[1]]))


def test_hooks_and_other_kernels_take_the_module_path(fast_on):
    lm = tiny_lm(layers=2)
    model = lm.model
    seen = []
    handle = model.model.layers[1].self_attn.register_forward_hook(lambda m, a, o: seen.append(o[0].shape))
    try:
        with torch.inference_mode():
            model(input_ids=torch.tensor([[1, 2]]))
        assert seen == [torch.Size([1, 2, 64])]  # the hook saw the attention module run
    finally:
        handle.remove()
    force_fast(lm)
    linear.use_kernel(model, "packed")
    with torch.inference_mode(), pytest.raises(AssertionError, match="module path"):
        model(input_ids=torch.tensor([[1, 2]]))
    linear.use_kernel(model, "tiled")
    with torch.inference_mode():
        model(input_ids=torch.tensor([[1, 2]]))


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_weights_are_views_and_the_state_dict_is_unchanged(dtype):
    torch.manual_seed(0)
    lm = tiny_lm(dtype=dtype, layers=2, kernel="stock")
    before = {k: v.clone() for k, v in lm.model.state_dict().items()}
    linear.use_kernel(lm.model, "tiled")
    norm.use_fast_norm(lm.model)
    assert layers.use_fast_layers(lm.model) == 2
    after = lm.model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    a = lm.model.model.layers[0].self_attn
    step = a.q_proj.weight.numel() * a.q_proj.weight.element_size()
    assert a.k_proj.weight.data_ptr() == a.q_proj.weight.data_ptr() + step
    assert a.k_proj.weight.untyped_storage().data_ptr() == a.v_proj.weight.untyped_storage().data_ptr()
    # A weight loaded in place reaches the fused tensor (and, in bfloat16, the copies packed from
    # it): the fast forward still equals the module path.
    with torch.no_grad():
        a.v_proj.weight.mul_(-1.5)
        lm.model.model.layers[1].mlp.down_proj.weight.mul_(0.5)
    prompt = list(range(20))
    tree = random_tree(random.Random(1), 4, 6, lm.vocab_size)
    fast, slow = both_paths(lm, lambda: tree_logits(lm, prompt, tree))
    assert torch.equal(fast, slow)


def test_a_dtype_move_leaves_the_stale_fused_weights_alone(fast_on):
    if not tiled_bf16_available():
        pytest.skip("needs the bf16 kernels")
    lm = tiny_lm(dtype=torch.bfloat16, layers=2)
    lm.model.float()  # replaces every parameter's data: the fused bf16 tensors are stale now
    lm.dtype = torch.float32
    layer = lm.model.model.layers[0]
    assert not layers._runs(layer._racer_plan, torch.zeros(1, 1, 64), layer)
    prompt = list(range(12))
    tree = random_tree(random.Random(2), 4, 5, lm.vocab_size)
    fast, slow = both_paths(lm, lambda: tree_logits(lm, prompt, tree))
    assert torch.equal(fast, slow)


def _family(cls_cfg, cls_model, dtype, **extra):
    torch.manual_seed(0)
    cfg = cls_cfg(vocab_size=80, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False, **extra)
    cfg._attn_implementation = attention.register()
    model = cls_model(cfg).to(dtype).eval()
    with torch.no_grad():  # non-zero biases, so fusing them is tested
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_()
    linear.use_kernel(model, "tiled")
    norm.use_fast_norm(model)
    return model


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", ["qwen2", "mistral"])
def test_qwen2_and_mistral_layers(family, dtype, fast_on):
    model = _family(Qwen2Config, Qwen2ForCausalLM, dtype) if family == "qwen2" else \
        _family(MistralConfig, MistralForCausalLM, dtype, head_dim=16)
    assert layers.use_fast_layers(model) == 2
    if family == "qwen2":
        assert model.model.layers[0].self_attn.q_proj.bias is not None

    class LM:
        pass
    lm = LM()
    lm.model, lm.device, lm.dtype, lm.vocab_size = model, torch.device("cpu"), dtype, 80
    rng = random.Random(3)
    prompt = [rng.randrange(80) for _ in range(30)]
    tree = random_tree(rng, 5, 9, 80)
    force_fast(lm)
    fast = tree_logits(lm, prompt, tree)  # 30-token prefill and the tree: all on the fast forward
    for layer in model.model.layers:
        del layer.__dict__["_racer_base"]
    ON.fast_layer = False
    slow = tree_logits(lm, prompt, tree)
    assert torch.equal(fast, slow)


def test_layers_it_cannot_reproduce_keep_their_forward():
    lm = tiny_lm(layers=2, kernel="stock")
    assert layers.use_fast_layers(lm.model) == 0  # stock linears and norms: nothing to call directly
    assert type(lm.model.model.layers[0]).__name__ == "LlamaDecoderLayer"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", [64, 128, 16, 20])    # half a head of whole 8-lane blocks (vector path) or not
def test_rope_kernel_equals_transformers_rotary(dtype, D):
    g = torch.Generator().manual_seed(0)
    B, T, H, G = 1, 7, 6, 2
    qkv = (torch.randn(B, T, (H + 2 * G) * D, generator=g) * 30).to(dtype)
    # Rounding's edge cases: values whose products tie at bf16's last place, underflow to
    # subnormals, overflow, infinities and NaNs.
    flat = qkv.view(-1)
    flat[:8] = torch.tensor([1e-38, -1e-39, 3e38, -3e38, float("inf"), float("nan"), 1.00390625, -0.0])
    pos = torch.arange(1000, 1000 + T, dtype=torch.float32)
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2).float() / D))
    emb = torch.cat([pos[:, None] * inv, pos[:, None] * inv], -1)[None]
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    q = qkv[..., :H * D]
    k = qkv[..., H * D:(H + G) * D]
    want_q, want_k = apply_rotary_pos_emb(q.reshape(B, T, H, D).transpose(1, 2), k.reshape(B, T, G, D).transpose(1, 2),
                                          cos, sin)
    ops = extension()
    got_q = ops.rope_rows(q, cos, sin).view(B, T, H, D).transpose(1, 2)  # strided rows: a slice of q|k|v
    got_k = ops.rope_rows(k.contiguous(), cos, sin).view(B, T, G, D).transpose(1, 2)

    def same(a, b):  # bit for bit, a NaN where the other has one
        return torch.equal(a.isnan(), b.isnan()) and torch.equal(a[~a.isnan()], b[~b.isnan()])
    assert got_q.isnan().any() and same(got_q, want_q) and same(got_k, want_k)


def test_rope_kernel_rejects_bad_input():
    ops = extension()
    x, c = torch.zeros(1, 2, 128), torch.zeros(1, 2, 64)
    with pytest.raises(RuntimeError, match="whole heads"):
        ops.rope_rows(torch.zeros(1, 2, 100), c, c)
    with pytest.raises(RuntimeError, match="one row per token"):
        ops.rope_rows(x, torch.zeros(1, 3, 64), torch.zeros(1, 3, 64))
    with pytest.raises(RuntimeError, match="one dtype"):
        ops.rope_rows(x, c.double(), c.double())


bf16_only = pytest.mark.skipif(not tiled_bf16_available(), reason="racer's bf16 kernels need AVX512-BF16")


@bf16_only
@pytest.mark.parametrize("rows", [1, 8, 300])   # one task, two, the prefill's many
def test_silu_mul_kernel_gives_pytorchs_bits(rows):
    """Every bf16 gate value (subnormals, infinities and NaNs among them) against up values of every
    magnitude and against ordinary ones, then random rows at the default model's width."""
    ops = extension()
    assert layers.silu_mul_matches_torch()
    gate = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    g = torch.Generator().manual_seed(rows)
    for up in (gate[torch.randperm(gate.numel(), generator=g)], torch.randn(gate.numel(), generator=g).bfloat16()):
        gu = torch.cat([gate.view(-1, 1024), up.view(-1, 1024)], 1)
        want = torch.nn.functional.silu(gu[:, :1024]) * gu[:, 1024:]
        got = ops.silu_mul_bf16(gu, 1024)
        assert torch.equal(want.isnan(), got.isnan())
        assert torch.equal(want[~want.isnan()].view(torch.int16), got[~got.isnan()].view(torch.int16))
    gu = (torch.randn(1, rows, 2 * 1536, generator=g) * 4).bfloat16()
    want = torch.nn.functional.silu(gu[..., :1536]) * gu[..., 1536:]
    assert torch.equal(ops.silu_mul_bf16(gu, 1536).view(torch.int16), want.view(torch.int16))
    with pytest.raises(RuntimeError, match="2 \\* inter"):
        ops.silu_mul_bf16(gu, 1000)


@bf16_only
def test_layers_take_the_silu_kernel_only_where_pytorchs_silu_has_no_scalar_tail(fast_on):
    whole = tiny_lm(dtype=torch.bfloat16, layers=2, head_dim=64)   # intermediate 128: two 64-element vectors
    assert layers.silu_mul_count(whole.model) == 2
    model = _family(Qwen2Config, Qwen2ForCausalLM, torch.bfloat16)   # intermediate 96: PyTorch's silu ends in scalars
    assert layers.use_fast_layers(model) == 2 and layers.silu_mul_count(model) == 0
