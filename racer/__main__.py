"""Command line: python -m racer "PROMPT" --method racer --max-new-tokens 256

On a terminal, accepted draft tokens are shown on a background of their source's colour, the
same colour code as the app's figures (racer.palette, as 24-bit ANSI colours); the model's own
tokens stay plain. --no-color, NO_COLOR, --json or output that is not a terminal: no colour.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from .palette import SOURCE_COLORS, SOURCE_HUES, SOURCE_NAMES, ansi_background

#: Sources a draft can come from, in legend order (the root token is the model's own: plain).
DRAFT_SOURCES = ("retrieval", "logits", "both", "lookup", "template")
COLORS = {"root": "", **{s: ansi_background(SOURCE_COLORS[s]) for s in DRAFT_SOURCES}}
RESET = "\033[0m"


def legend_line() -> str:
    """Every draft source in its own colour, named as in the figures' legends."""
    return "  " + " ".join(f"{COLORS[s]} {SOURCE_HUES[s]}: {SOURCE_NAMES[s]} {RESET}" for s in DRAFT_SOURCES)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from .drafters import METHODS
    p = argparse.ArgumentParser(prog="python -m racer", description="Decode a prompt with a speculative method.")
    p.add_argument("prompt", nargs="?", help="the user prompt (reads standard input when omitted)")
    p.add_argument("--method", default="racer", choices=METHODS)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--capacity", default="auto",
                   help="draft tree size incl. the root, or 'auto' (sized from this machine's measured cost curve)")
    p.add_argument("--model", default="default",
                   help="'default' (SmolLM2-135M-Instruct), 'gemma3-270m' (Gemma 3 270M, base model: plain "
                        "completion), a hub id, a local folder or a .gguf file")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--system", default=None, help="system prompt")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("--no-color", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from . import DecodeConfig, DecodeRun, ModelLoadError, build_input_ids, load_model, make_drafter
    prompt = args.prompt if args.prompt is not None else sys.stdin.read()
    if not prompt.strip():
        print("error: the prompt is empty", file=sys.stderr)
        return 2
    try:
        lm = load_model(args.model, device=args.device, dtype=args.dtype)
    except ModelLoadError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        if args.capacity != "auto" and not args.capacity.isdigit():
            raise ValueError(f"--capacity must be 'auto' or a whole number, not {args.capacity!r}")
        capacity: object = args.capacity if args.capacity == "auto" else int(args.capacity)
        cfg = DecodeConfig(max_new_tokens=args.max_new_tokens, capacity=capacity,  # type: ignore[arg-type]
                           temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed)
        ids = build_input_ids(lm.tokenizer, prompt, system=args.system)
        drafter = make_drafter(args.method, vocab_size=lm.vocab_size)
        if drafter.wants_cold_rows:
            # Made once per machine by the app's warm-up or the benchmark; a one-off decode does
            # not wait a minute for them.
            from .coldrows import get_cold_rows
            if get_cold_rows(lm, make=False) is None and not args.json:
                print("note: no cold rows for this model on this machine yet (the app and the benchmark make "
                      "them), so roots the text never held draft nothing", file=sys.stderr)
        run = DecodeRun(lm, ids, drafter, cfg)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    color = not (args.no_color or args.json or os.environ.get("NO_COLOR")) and sys.stdout.isatty()
    tok = lm.tokenizer
    shown: list[int] = []
    printed = ""
    for step in run:
        if args.json:
            continue
        # Colour the accepted draft tokens by source; the root token stays plain.
        sources = step.accepted_sources
        for tok_id, src in zip(step.committed, sources):
            shown.append(tok_id)
            text = tok.decode(shown, skip_special_tokens=True)
            piece, printed = text[len(printed):], text
            if color and src != "root":
                piece = f"{COLORS.get(src, '')}{piece}{RESET}"
            sys.stdout.write(piece)
        sys.stdout.flush()
    res = run.result
    assert res is not None
    if args.json:
        out = res.to_dict()
        out.update({"model": lm.name, "device": str(lm.device), "dtype": str(lm.dtype).replace("torch.", "")})
        print(json.dumps(out, ensure_ascii=False))
    else:
        print()
        print(f"\n[{res.method}] {res.new_tokens} tokens in {res.forwards} forwards, MAT {res.mat:.2f}, "
              f"{res.tokens_per_s:.1f} tokens/s, {res.wall_s:.2f} s, stop: {res.stop_reason}; "
              f"{lm.name} on {lm.device} {str(lm.dtype).replace('torch.', '')}", file=sys.stderr)
        if color:
            print(legend_line(), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
