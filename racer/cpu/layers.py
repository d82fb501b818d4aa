"""Llama-family decoder layers run without their module tree for the few-token forwards of decoding.

A decoding step's forward is mostly streaming weights, but transformers' layer is a tree of a
dozen modules and about forty PyTorch calls per layer: on the default model (30 layers, bf16,
2-core EPYC) a one-token forward took 16.9 ms of which the linear kernels were 10.2 and attention
1.2; most of the rest was module dispatch, `__getattr__`, the rotary embedding's ten small ops per
tensor and per-call argument handling. This runs the same computation with racer's kernels called
directly:

- q/k/v and gate/up each become one product: their weights are fused into one tensor (the
  modules' parameters become views of it, so no memory is added). The tiled kernel sums every
  output in the same order wherever its row sits in the weight, so a fused product is bit-identical
  to the separate ones.
- the rotary embedding is racer's kernel (csrc/rope.cpp) with PyTorch's rounding steps;
- in bfloat16, silu(gate) * up is one kernel call (csrc/silu_mul.cpp) with PyTorch's rounding
  steps, where the intermediate size is a multiple of 64 and the kernel matched PyTorch's ops on
  every bf16 gate value (`silu_mul_matches_torch`); elsewhere PyTorch's SiLU and product;
- RMSNorm, attention (racer_sdpa) and the cache update are the ones the modules call; the
  residual adds stay PyTorch ops.

Every step is the module path's, in its order and rounding: the logits equal the module path's bit
for bit (tests/test_cpu_layers.py), so every method, and transformers' own generate(), gets the
same numbers as before, only sooner. Anything else runs the layer's own forward: autograd, a
device other than the CPU, a dtype or linear kernel other than racer's tiled one, in float32 more
than TILED_MAX_ROWS rows (prefill; in bfloat16 the packed kernel takes any number of rows), hooks
on the layer's modules (transformers' output_attentions capture), training mode, or weights
replaced since the swap. RACER_FAST_LAYER=0 turns it off.

Measured (python -m racer.kernelbench.decoder_layers, context 600): a verify
forward of 1 / 4 / 8 tokens 1.34 / 1.29 / 1.20x faster than the module path in bfloat16, 1.12 /
1.17 / 1.18x in float32.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from . import attention
from .build import extension
from .linear import TILED_MAX_ROWS, TiledLinear, drop_packed
from .norm import FastRMSNorm
from .switches import ON

# Decoder layers whose forward is Llama's (transformers 5: identical source, Qwen2 and Mistral
# only add a sliding_window argument to the attention call), and where that argument comes from.
_LAYERS = {"LlamaDecoderLayer": None, "MistralDecoderLayer": "config", "Qwen2DecoderLayer": "module"}


class _Plan:
    """What a layer's fast forward needs, gathered once (module attribute lookups cost ~0.7 us each)."""

    __slots__ = ("attn", "modules", "linears", "checks", "dtype", "w_qkv", "b_qkv", "q_cols", "k_cols",
                 "w_o", "b_o", "w_gu", "b_gu", "inter", "silu_contig", "silu_mul", "w_down", "b_down", "norm1", "norm2",
                 "eps1", "eps2", "head_dim", "extra", "ops", "linear", "config", "sources", "stamps", "max_rows")


def _fuse(mods: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """One weight (and bias) for `mods`, whose parameters become views of it; None where they
    cannot share one (shapes, dtypes, devices or biases differ)."""
    ws = [m.weight for m in mods]
    if len({(w.dtype, w.device, w.shape[1]) for w in ws}) != 1 or any(w.dim() != 2 for w in ws):
        return None
    biases = [m.bias for m in mods]
    if any(b is None for b in biases) and not all(b is None for b in biases):
        return None

    def joined(ts: list[torch.Tensor]) -> torch.Tensor:
        out = torch.cat([t.detach() for t in ts], 0)
        off = 0
        for t in ts:
            t.data = out[off:off + t.shape[0]]
            off += t.shape[0]
        return out

    w = joined(ws)
    b = None if biases[0] is None else joined(biases)
    for m in mods:
        if getattr(m, "_racer_packed", None) is not None and hasattr(m, "_packed"):
            m._packed()  # prefill's reordered copy follows the moved weight now, not at first use
    return w, b


def _plan(layer: nn.Module) -> _Plan | None:
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    names = ("q_proj", "k_proj", "v_proj", "o_proj")
    if attn is None or mlp is None or not all(isinstance(getattr(attn, n, None), nn.Linear) for n in names) \
            or not all(isinstance(getattr(mlp, n, None), nn.Linear) for n in ("gate_proj", "up_proj", "down_proj")) \
            or not isinstance(attn.q_proj, TiledLinear) or hasattr(attn, "q_norm") or hasattr(attn, "k_norm") \
            or type(getattr(mlp, "act_fn", None)).__name__ not in ("SiLUActivation", "SiLU") \
            or not isinstance(getattr(layer, "input_layernorm", None), FastRMSNorm) \
            or not isinstance(getattr(layer, "post_attention_layernorm", None), FastRMSNorm):
        return None
    D = int(attn.head_dim)
    q, k, v, o = (getattr(attn, n) for n in names)
    if q.out_features % D or k.out_features % D or k.out_features != v.out_features:
        return None
    qkv = _fuse([q, k, v])
    gu = _fuse([mlp.gate_proj, mlp.up_proj])
    if qkv is None or gu is None:
        return None
    p = _Plan()
    p.attn = attn
    p.linears = (q, k, v, o, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
    p.modules = (layer.input_layernorm, attn, layer.post_attention_layernorm, mlp, mlp.act_fn) + p.linears
    p.dtype = q.weight.dtype
    p.w_qkv, p.b_qkv = qkv
    p.q_cols, p.k_cols = q.out_features, k.out_features
    p.w_o, p.b_o = o.weight, o.bias
    p.w_gu, p.b_gu = gu
    p.inter = mlp.gate_proj.out_features
    # PyTorch's vectorised SiLU treats a row's tail elementwise-differently from its body; a
    # gate whose width is a whole number of vectors (64 bf16) rounds the same as the module's.
    p.silu_contig = p.inter % 64 != 0
    # In bfloat16, silu(gate) * up as one kernel call with the same bits (csrc/silu_mul.cpp), where
    # PyTorch's silu runs no scalar tail and the kernel matches PyTorch's ops on this machine.
    p.silu_mul = p.dtype == torch.bfloat16 and p.inter % 64 == 0 and silu_mul_matches_torch()
    p.w_down, p.b_down = mlp.down_proj.weight, mlp.down_proj.bias
    p.norm1, p.eps1 = layer.input_layernorm.weight, float(layer.input_layernorm.variance_epsilon)
    p.norm2, p.eps2 = layer.post_attention_layernorm.weight, float(layer.post_attention_layernorm.variance_epsilon)
    p.head_dim = D
    # The fused parameters must still be views of the fused weights (a dtype or device move
    # replaces them).
    p.checks = tuple((t, t.data_ptr()) for m in (q, k, v, mlp.gate_proj, mlp.up_proj)
                     for t in (m.weight, m.bias) if t is not None)
    where = _LAYERS[type(layer)._racer_base.__name__]
    p.extra = {} if where is None else \
        {"sliding_window": attn.sliding_window if where == "module" else getattr(attn.config, "sliding_window", None)}
    # The config's own dict: its attribute lookup runs transformers' __getattribute__ (~2 us).
    p.config = object.__getattribute__(attn.config, "__dict__")
    p.ops = extension()
    if p.dtype == torch.float32:
        p.linear, p.max_rows, p.sources, p.stamps = p.ops.tiled_linear, TILED_MAX_ROWS, None, ()
    else:
        # bfloat16 multiplies copies of the weights packed for its kernel, for every number of
        # rows, prefill included, so the modules' own packed copies can go (the module path, if
        # it ever runs, packs them again).
        bf = p.ops.packed_linear_bf16
        p.linear, p.max_rows = (lambda x, w, b: bf(x, w[0], w[1], b)), None
        p.sources = (p.w_qkv, p.w_o, p.w_gu, p.w_down)
        _pack_plan(p)
        for m in p.linears:
            drop_packed(m)
    return p


def plan_weights(p: _Plan) -> list[torch.Tensor]:
    """The tensors a plan's products multiply: in bfloat16 the packed copies, in float32 the
    fused weights and the output and down projections' own."""
    return [w[0] if isinstance(w, tuple) else w for w in (p.w_qkv, p.w_o, p.w_gu, p.w_down)]


def _pack_plan(p: _Plan) -> None:
    """The bfloat16 plan's weights packed afresh from `p.sources`, stamped with the versions of
    the parameters they hold (a write in place into any of them moves its counter)."""
    pack = p.ops.pack_bf16
    p.w_qkv, p.w_o, p.w_gu, p.w_down = ((pack(w.detach()), w.shape[0]) for w in p.sources)
    p.stamps = tuple((m.weight, m.weight._version) for m in p.linears)


def _runs(p: _Plan, x: torch.Tensor, layer: nn.Module) -> bool:
    if not (ON.fast_layer and x.dtype == p.dtype and x.device.type == "cpu" and x.dim() == 3
            and (p.max_rows is None or x.shape[0] * x.shape[1] <= p.max_rows) and not torch.is_grad_enabled()
            and not layer.training and type(p.linears[0]) is TiledLinear
            and p.config.get("_attn_implementation_internal") == attention.NAME):
        return False
    if nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks:
        return False
    for m in p.modules:
        if m._forward_hooks or m._forward_pre_hooks:
            return False
    for t, ptr in p.checks:
        if t.data_ptr() != ptr or t.dtype != p.dtype:
            return False
    if any(w._version != v for w, v in p.stamps):
        _pack_plan(p)  # a weight was written in place: its packed copy is stale
    return True


def _forward(self: nn.Module, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
             position_ids: torch.Tensor | None = None, cache: Any = None, use_cache: bool | None = False,
             position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None, **kwargs: Any) -> torch.Tensor:
    p = self.__dict__.get("_racer_plan")
    if p is None or position_embeddings is None or position_embeddings[0].dtype != hidden_states.dtype \
            or "past_key_values" in kwargs or not _runs(p, hidden_states, self):
        return self._racer_base.forward(self, hidden_states, attention_mask=attention_mask, position_ids=position_ids,
                                        cache=cache, use_cache=use_cache, position_embeddings=position_embeddings,
                                        **kwargs)
    ops, lin = p.ops, p.linear
    x = hidden_states
    B, T, _ = x.shape
    D = p.head_dim
    h = ops.rms_norm(x, p.norm1, p.eps1)
    qkv = lin(h, p.w_qkv, p.b_qkv)
    qc, kc = p.q_cols, p.k_cols
    cos, sin = position_embeddings
    q = ops.rope_rows(qkv[..., :qc], cos, sin).view(B, T, -1, D).transpose(1, 2)
    k = ops.rope_rows(qkv[..., qc:qc + kc], cos, sin).view(B, T, -1, D).transpose(1, 2)
    v = qkv[..., qc + kc:].view(B, T, -1, D).transpose(1, 2)
    if cache is not None:
        k, v = cache.update(k, v, p.attn.layer_idx, kwargs=kwargs)
    a, _ = attention.tree_sdpa_forward(p.attn, q, k, v, attention_mask, dropout=0.0, scaling=p.attn.scaling,
                                       position_ids=position_ids, use_cache=use_cache, **p.extra, **kwargs)
    x = x + lin(a.reshape(B, T, -1), p.w_o, p.b_o)
    h = ops.rms_norm(x, p.norm2, p.eps2)
    gu = lin(h, p.w_gu, p.b_gu)
    if p.silu_mul and ON.silu_mul:
        return x + lin(ops.silu_mul_bf16(gu, p.inter), p.w_down, p.b_down)
    g = gu[..., :p.inter]
    if p.silu_contig:
        g = g.contiguous()
    return x + lin(F.silu(g) * gu[..., p.inter:], p.w_down, p.b_down)


@lru_cache(maxsize=1)
def silu_mul_matches_torch() -> bool:
    """Whether racer's silu * up kernel gives PyTorch's bits here, checked on every bf16 gate
    value (each times a spread of up values): it calls the SLEEF exp PyTorch's AVX-512 silu uses,
    and a PyTorch that computed silu otherwise (another version, ATEN_CPU_CAPABILITY=avx2) must
    keep its own ops."""
    ops = extension()
    if ops is None or not ops.silu_mul_available():
        return False
    gate = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    up = torch.linspace(-3.0, 3.0, gate.numel()).to(torch.bfloat16)
    gu = torch.stack([gate.view(-1, 64), up.view(-1, 64)], 1).reshape(-1, 128)
    want = F.silu(gu[:, :64]) * gu[:, 64:]
    got = ops.silu_mul_bf16(gu, 64)
    same = (want.view(torch.int16) == got.view(torch.int16)) | (want.isnan() & got.isnan())
    return bool(same.all())


_FAST_CLASSES: dict[type, type] = {}


def _fast_class(cls: type) -> type:
    if cls not in _FAST_CLASSES:
        _FAST_CLASSES[cls] = type(f"Fast{cls.__name__}", (cls,), {"forward": _forward, "_racer_base": cls})
    return _FAST_CLASSES[cls]


def use_fast_layers(model: nn.Module) -> int:
    """Give every supported decoder layer of `model` the fast forward, in place (a class swap:
    parameters, hooks and state dicts stay; q/k/v and gate/up weights become views of fused
    tensors); returns how many. Needs racer's tiled linear kernel in the model's dtype and its
    RMSNorm (racer.cpu.norm) already swapped in."""
    if extension() is None:
        return 0
    n = 0
    for module in model.modules():
        cls = type(module)
        base = getattr(cls, "_racer_base", cls)
        if base.__name__ not in _LAYERS:
            continue
        if cls is base:
            module.__class__ = _fast_class(base)
        with torch.no_grad():
            plan = _plan(module)
        if plan is None:
            module.__class__ = base
            module.__dict__.pop("_racer_plan", None)
            continue
        module.__dict__["_racer_plan"] = plan
        n += 1
    return n


def plans(model: nn.Module) -> list[_Plan]:
    """The plans of `model`'s decoder layers that have the fast forward, in layer order (the
    scripts that switch or time what a layer calls change them in place)."""
    return [m.__dict__["_racer_plan"] for m in model.modules() if "_racer_plan" in m.__dict__]


def count(model: nn.Module) -> int:
    """How many of `model`'s decoder layers have the fast forward."""
    return len(plans(model))


def silu_mul_count(model: nn.Module) -> int:
    """How many of `model`'s fast decoder layers take racer's silu * up kernel (bfloat16)."""
    return sum(1 for m in model.modules() if getattr(m.__dict__.get("_racer_plan"), "silu_mul", False))
