"""Tiny randomly initialised models for fast tests, the figure gallery and dry runs: built offline
from a transformers config, with racer's CPU kernels installed as `load_model` installs them."""
from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from . import cpu
from .models import LoadedModel


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


def tiny_lm(vocab: int = 96, seed: int = 0, layers: int = 2, eos: int | None = None, max_context: int = 512,
            dtype: torch.dtype = torch.float32, attn: str = "sdpa", kernel: str = "auto",
            head_dim: int | None = None) -> LoadedModel:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_context,
                      tie_word_embeddings=False, **({"head_dim": head_dim} if head_dim else {}))
    cfg._attn_implementation = cpu.attention_implementation(attn)
    model = LlamaForCausalLM(cfg).to(dtype).eval()
    # Sharpen the output so greedy paths are stable and repeated text is likely (drafts get accepted).
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    # As load_model does, so every tiny test runs the kernels shipped for this device and dtype.
    notes = cpu.install(model, torch.device("cpu"), dtype, kernel)
    eos_ids = frozenset() if eos is None else frozenset({eos})
    return LoadedModel(model, TinyTokenizer(vocab), "tiny", "tiny-llama", torch.device("cpu"), dtype, eos_ids,
                       max_context, vocab, 0.0, "test", notes)
