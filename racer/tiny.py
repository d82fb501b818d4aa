"""Tiny randomly initialised models for fast tests, the figure gallery and dry runs: built offline
from transformers configs of the popular decoder families, then made ready exactly as
`load_model` makes a real model ready (racer.models.prepare_model: kernels, attention layout,
the tree-forward check).

Every family keeps what makes it differ from Llama (sliding windows, q/k norms, biases, soft-
capping, fused projections, partial rotary, learned positions, experts) at a size that decodes
in milliseconds; sliding windows are 8 tokens, so test prompts run well past them.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from . import cpu
from .architecture import attention_implementation
from .models import LoadedModel, prepare_model

#: Sliding window of the windowed families (tokens).
WINDOW = 8


class TinyTokenizer:
    """Token i <-> the text 't{i} '. Enough for decode-loop tests."""
    chat_template = None
    eos_token_id = None

    def __init__(self, vocab: int) -> None:
        self.vocab = vocab

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(f"t{int(i)} " for i in ids)

    def __len__(self) -> int:
        return self.vocab


# Special ids inside the tiny vocabulary (the families' defaults point past it); the decode loop
# takes its end-of-sequence ids from tiny_lm's `eos`.
_IDS = dict(bos_token_id=0, eos_token_id=None, pad_token_id=0)


def _common(vocab: int, layers: int, max_context: int, head_dim: int | None) -> dict[str, Any]:
    return dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_context,
                tie_word_embeddings=False, **_IDS, **({"head_dim": head_dim} if head_dim else {}))


def _llama(c: dict[str, Any]) -> Any:
    from transformers import LlamaConfig
    return LlamaConfig(**c)


def _mistral(c: dict[str, Any]) -> Any:
    from transformers import MistralConfig
    return MistralConfig(**c, sliding_window=WINDOW)


def _qwen2(c: dict[str, Any]) -> Any:
    from transformers import Qwen2Config
    # Sliding layers from the second on (max_window_layers): one full layer, the rest windowed.
    return Qwen2Config(**c, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)


def _qwen3(c: dict[str, Any]) -> Any:
    from transformers import Qwen3Config
    return Qwen3Config(**c)


def _gemma2(c: dict[str, Any]) -> Any:
    from transformers import Gemma2Config
    return Gemma2Config(**{**c, "head_dim": c.get("head_dim") or 16}, sliding_window=WINDOW,
                        attn_logit_softcapping=50.0, final_logit_softcapping=30.0, query_pre_attn_scalar=16)


def _gemma3(c: dict[str, Any]) -> Any:
    from transformers import Gemma3TextConfig
    n = c["num_hidden_layers"]
    # Gemma 3's pattern (five local layers, then one global) shortened to alternate.
    types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]
    return Gemma3TextConfig(**{**c, "head_dim": c.get("head_dim") or 16}, sliding_window=WINDOW, layer_types=types,
                            query_pre_attn_scalar=16)


def _phi3(c: dict[str, Any]) -> Any:
    from transformers import Phi3Config
    return Phi3Config(**c)


def _olmo2(c: dict[str, Any]) -> Any:
    from transformers import Olmo2Config
    return Olmo2Config(**c)


def _granite(c: dict[str, Any]) -> Any:
    from transformers import GraniteConfig
    return GraniteConfig(**c, embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=0.2,
                         logits_scaling=0.5)


def _gpt_neox(c: dict[str, Any]) -> Any:
    from transformers import GPTNeoXConfig
    return GPTNeoXConfig(vocab_size=c["vocab_size"], hidden_size=64, intermediate_size=128,
                         num_hidden_layers=c["num_hidden_layers"], num_attention_heads=4,
                         max_position_embeddings=c["max_position_embeddings"], rotary_pct=0.25,
                         use_parallel_residual=True, tie_word_embeddings=False, **_IDS)


def _mixtral(c: dict[str, Any]) -> Any:
    from transformers import MixtralConfig
    return MixtralConfig(**c, num_local_experts=4, num_experts_per_tok=2)


def _gpt2(c: dict[str, Any]) -> Any:
    from transformers import GPT2Config
    return GPT2Config(vocab_size=c["vocab_size"], n_embd=64, n_layer=c["num_hidden_layers"], n_head=4,
                      n_positions=c["max_position_embeddings"], tie_word_embeddings=False, **_IDS)


#: Family name -> config builder; the names are the test ids of the architecture matrix.
FAMILIES: dict[str, Callable[[dict[str, Any]], Any]] = {
    "llama": _llama, "mistral": _mistral, "qwen2": _qwen2, "qwen3": _qwen3, "gemma2": _gemma2, "gemma3": _gemma3,
    "phi3": _phi3, "olmo2": _olmo2, "granite": _granite, "gpt-neox": _gpt_neox, "mixtral": _mixtral, "gpt2": _gpt2,
}


def tiny_config(family: str = "llama", vocab: int = 96, layers: int = 2, max_context: int = 512,
                head_dim: int | None = None) -> Any:
    """The transformers config of a tiny model of `family` (one of FAMILIES)."""
    try:
        build = FAMILIES[family]
    except KeyError:
        raise ValueError(f"unknown family {family!r}; one of {', '.join(FAMILIES)}") from None
    return build(_common(vocab, layers, max_context, head_dim))


def tiny_lm(vocab: int = 96, seed: int = 0, layers: int = 2, eos: int | None = None, max_context: int = 512,
            dtype: torch.dtype = torch.float32, attn: str = "sdpa", kernel: str = "auto",
            head_dim: int | None = None, family: str = "llama") -> LoadedModel:
    """A tiny random model of `family`, ready for the decode loop as load_model would make it."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = tiny_config(family, vocab, layers, max_context, head_dim)
    impl, note = attention_implementation(cfg, attn)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=cpu.attention_implementation(impl))
    model = model.to(dtype).eval()
    # Sharpen the output so greedy paths are stable and repeated text is likely (drafts get accepted).
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)
    lm = prepare_model(model, TinyTokenizer(vocab), spec="tiny", name=f"tiny-{family}", linear_kernel=kernel,
                       source="test", notes=[note] if note else [])
    lm.eos_ids = frozenset() if eos is None else frozenset({eos})
    lm.max_context = max_context
    return lm
