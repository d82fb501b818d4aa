"""RMSNorm by racer's kernel (csrc/rms_norm.cpp) for the Llama-family modules that compute
w * to_dtype(x * rsqrt(mean(x^2) + eps)).

A one-token forward of the default model runs 61 of them; PyTorch's eight ops took about 18 us
each (1.1 ms of an 18.5 ms bf16 forward, 2-core EPYC), the kernel about 2. The swap changes each
module's class in place (parameters, hooks and state dicts stay); anything the kernel does not take
(another device or dtype, autograd) runs the module's own formula.
"""
from __future__ import annotations

import torch
from torch import nn

from .build import extension
from .switches import ON

# Classes whose forward is exactly the formula above (transformers 5; Gemma's 1 + w differs).
FORMULA_CLASSES = frozenset({"LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm"})


class FastRMSNorm(nn.Module):
    """A swapped-in Llama-family RMSNorm (keeps `weight` and `variance_epsilon`)."""

    weight: nn.Parameter
    variance_epsilon: float

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        ops = extension() if ON.norm else None
        if (ops is not None and hidden_states.device.type == "cpu" and hidden_states.dtype in (torch.float32, torch.bfloat16)
                and self.weight.dtype == hidden_states.dtype and not torch.is_grad_enabled()):
            return ops.rms_norm(hidden_states, self.weight, float(self.variance_epsilon))
        input_dtype = hidden_states.dtype
        h = hidden_states.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(input_dtype)


def use_fast_norm(model: nn.Module) -> int:
    """Swap every RMSNorm of FORMULA_CLASSES in `model` to FastRMSNorm where the kernel is built
    and RACER_NORM_KERNEL is not 0; returns how many."""
    if not ON.norm or extension() is None:
        return 0
    n = 0
    for module in model.modules():
        if type(module).__name__ in FORMULA_CLASSES and isinstance(getattr(module, "weight", None), torch.Tensor) \
                and hasattr(module, "variance_epsilon"):
            module.__class__ = FastRMSNorm
            n += 1
    return n
