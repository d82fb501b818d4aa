"""The cost curve t(T) of model shapes with random weights (cost does not depend on the weights):
the default model's shape and a 1.5B-class shape, on any device, without their weights:

    python -m racer.kernelbench.shapes [--device cuda] [--dtype bfloat16] [--shapes smollm2-135m,qwen2-1.5b]
                                       [--sizes 1,2,4,8,16,32,64,96,128] [--contexts 128,512,1536]

Prints, per shape, a markdown table of ms per verify forward against tree size and context, and
t(T)/t(1) at the middle context: what sizing decides on.
"""
from __future__ import annotations

import argparse
from typing import Any

import torch

from ..costcurve import measure
from ..models import prepare_model, resolve_device, resolve_dtype

#: Public configs' dimensions (SmolLM2-135M-Instruct; Qwen2-1.5B).
SHAPES: dict[str, dict[str, Any]] = {
    "smollm2-135m": dict(family="llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True),
    "qwen2-1.5b": dict(family="qwen2", hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                       num_attention_heads=12, num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
}


def shape_model(name: str, device: torch.device, dtype: torch.dtype) -> Any:
    """A LoadedModel of `name`'s shape with random weights, on `device` in `dtype`."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    from ..cpu import attention_implementation
    from ..tiny import TinyTokenizer

    dims = dict(SHAPES[name])
    family = dims.pop("family")
    cfg = (LlamaConfig if family == "llama" else Qwen2Config)(max_position_embeddings=4096, **dims)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation=attention_implementation("sdpa"),
                                                 dtype=dtype)
    return prepare_model(model.eval(), TinyTokenizer(cfg.vocab_size), spec=name, name=f"{name} (random weights)")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--sizes", default="1,2,4,8,16,32,64,96,128")
    ap.add_argument("--contexts", default="128,512,1536")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    dev = resolve_device(args.device)
    dt = resolve_dtype(args.dtype, dev)
    sizes = tuple(int(x) for x in args.sizes.split(","))
    contexts = tuple(int(x) for x in args.contexts.split(","))
    for name in args.shapes.split(","):
        lm = shape_model(name, dev, dt)
        curve = measure(lm, sizes=sizes, contexts=contexts, repeats=args.repeats)
        where = torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"cpu, {torch.get_num_threads()} threads"
        print(f"\n{name} shape, random weights, {str(dt).replace('torch.', '')}, {where}: ms per verify forward "
              f"(minimum of {args.repeats})\n")
        print("| context \\ T | " + " | ".join(map(str, curve.sizes)) + " |")
        print("|---" * (len(curve.sizes) + 1) + "|")
        for ctx, row in zip(curve.contexts, curve.ms):
            print(f"| {ctx} | " + " | ".join(f"{v:.2f}" for v in row) + " |")
        mid = curve.ms[len(curve.ms) // 2]
        print(f"\nt(T)/t(1) at context {curve.contexts[len(curve.ms) // 2]}: "
              + ", ".join(f"{T}: {v / mid[0]:.2f}" for T, v in zip(curve.sizes, mid)))
        del lm


if __name__ == "__main__":
    main()
