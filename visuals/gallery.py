"""Render every figure to PNG for the docs gallery.

    python -m visuals.gallery docs/gallery            # synthetic samples + the tiny test model
    python -m visuals.gallery OUTDIR --no-model       # synthetic samples only

With the tiny model it also draws the anatomy of one step (stage1_match … stage6_verify,
attention_mask, what_if; "_phone" at 390 px): the tiny random model decoded with the real
RACER drafter and sizer, replayed (racer.replay) and taken apart (racer.anatomy); its ids are
shown as sample words (samples.word) so labels have real text's widths.

Figures are rendered by kaleido (headless Chromium). Set BROWSER_PATH if Chromium is not on
PATH; /usr/bin/chromium is used when present. The coloured-text preview is an HTML page
(what `gr.HighlightedText` shows) screenshotted by the same Chromium.
"""
from __future__ import annotations

import argparse
import html
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

WIDTH = 900
#: The step inspector's column, and a phone, for the anatomy figures.
ANATOMY_WIDTH = 860
PHONE_WIDTH = 390


def _browser() -> str | None:
    path = os.environ.get("BROWSER_PATH")
    if path and os.path.exists(path):
        return path
    for name in ("/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name) or (name if os.path.exists(name) else None)
        if found:
            os.environ.setdefault("BROWSER_PATH", found)
            return found
    return None


def tiny_model_steps(max_new_tokens: int = 60) -> tuple[list[Any], Any]:
    """Real step records: the tiny random Llama of racer.tiny and the real RACER drafter."""
    import random

    from racer import DecodeConfig, DecodeRun, make_drafter
    from racer.tiny import tiny_lm

    lm = tiny_lm(vocab=96)
    rng = random.Random(0)
    chunk = [rng.randrange(96) for _ in range(8)]
    prompt = (chunk + [rng.randrange(96) for _ in range(3)]) * 4
    run = DecodeRun(lm, prompt, make_drafter("racer", vocab_size=96),
                    DecodeConfig(max_new_tokens=max_new_tokens, capacity=64, detail=True))
    steps = list(run)
    return steps, run.result


def tiny_decode(t: int) -> str:
    return f"t{int(t)} "


def _what_if_variants() -> list[Any]:
    """The what-if variants the step inspector compares (racer_app's table, for a default run)."""
    from racer.anatomy import Variant
    return [Variant(), Variant(retrieval=False), Variant(logits=False), Variant(lookup=False), Variant(capacity=8),
            Variant(capacity=16), Variant(capacity=64), Variant(breadth_rule="released")]


def steady_sizer(curve: Any) -> Any:
    """A sizer that learns from fixed step timings instead of measured ones: sizing reacts to
    the clock, so with real timings the same tiny run drafts other trees on every machine."""
    from racer.sizing import Sizer

    class SteadySizer(Sizer):
        def observe(self, tree: Any, accepted: list[int], timings: dict[str, float], **kw: Any) -> None:
            super().observe(tree, accepted, {"forward_ms": 12.0, "draft_ms": 1.0}, **kw)

    return SteadySizer(curve)


def tiny_racer_replay(seed: int = 3, max_new_tokens: int = 60) -> Any:
    """A replayable RACER run of the tiny random Llama, sized automatically against a synthetic
    cost curve (a forward costs 10 ms alone, 11 ms at 8 nodes, 40 ms at 64) and fixed timings:
    the data of the step anatomy without the real model, the same on every machine."""
    import random

    from racer import DecodeConfig, DecodeRun, make_drafter
    from racer.costcurve import CostCurve
    from racer.replay import Replay, Turn
    from racer.tiny import tiny_lm

    lm = tiny_lm(vocab=96)
    rng = random.Random(seed)
    chunk = [rng.randrange(96) for _ in range(8)]
    prompt = (chunk + [rng.randrange(96) for _ in range(3)]) * 4
    curve = CostCurve([1, 8, 64], [16], [[10.0, 11.0, 40.0]], {})
    run = DecodeRun(lm, prompt, make_drafter("racer", vocab_size=96), DecodeConfig(max_new_tokens=max_new_tokens),
                    sizer=steady_sizer(curve))
    steps = list(run)
    return Replay([Turn(run.start, steps)], lambda: make_drafter("racer", vocab_size=96), lambda: steady_sizer(curve))


def tiny_anatomy(seed: int = 3) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The anatomy of the tiny run's most telling step (borders, both trees, a cut and a
    mismatch where there is one) and its what-if results."""
    from racer import anatomy as A

    replay = tiny_racer_replay(seed)
    steps = replay.steps

    def score(k: int) -> tuple:
        a = A.anatomy(replay.before(k))
        if a.get("final"):
            return (-1,)
        return (len(a["match"]["borders"]) >= 2, a["verify"]["reason"] == "mismatch",
                a["merge"]["chosen_T"] < len(a["merge"]["pool"]["tokens"]), len(a["verify"]["accepted"]), -k)

    k = max(range(len(steps)), key=score)
    table = [A.what_if(replay.before(k), steps, v) for v in _what_if_variants()]
    return A.anatomy(replay.before(k)), table


def anatomy_figures(data: dict[str, Any], table: list[dict[str, Any]], decode: Any, width: int,
                    suffix: str = "") -> dict[str, Any]:
    """The step anatomy's figures by gallery file stem."""
    from .attention_figure import attention_mask_figure
    from .candidates_figure import logits_tree_figure, merged_pool_figure, retrieval_candidates_figure
    from .match_figure import match_figure
    from .sizer_figure import sizer_figure
    from .verify_figure import verify_figure
    from .what_if_figure import what_if_figure, what_if_tree_figure

    root = data["root"]
    best = max(table[1:], key=lambda r: (r.get("committed") or 0, -r["nodes"])) if len(table) > 1 else table[0]
    figs = {
        "stage1_match": match_figure(data["match"], decode, width=width),
        "stage2_retrieval": retrieval_candidates_figure(data["retrieval"], decode, root=root, width=width),
        "stage3_logits": logits_tree_figure(data["logits"], decode, root=root, width=width),
        "stage3_logits_layer2": logits_tree_figure(data["logits"], decode, root=root, layer=2, width=width),
        "stage4_merge": merged_pool_figure(data["merge"], decode, width=width),
        "stage4_sizer": sizer_figure(data["merge"], decode, width=width),
        "attention_mask": attention_mask_figure(data["attention"], decode, accepted=data["verify"]["accepted"],
                                                width=width),
        "stage6_verify": verify_figure(data["verify"], decode, tree=data["attention"]["tree"], width=width),
        "what_if": what_if_figure(table, decode, width=width),
        "what_if_tree": what_if_tree_figure(best, decode, width=width, base=table[0]["variant"]),
    }
    return {k + suffix: f for k, f in figs.items()}


def spans_html(spans: list[tuple[str, str | None]], step_of: list[int], title: str) -> str:
    from .colors import SOURCE_COLORS, SOURCE_NAMES, tint
    parts = []
    prev = None
    for (text, label), k in zip(spans, step_of):
        sep = '<span class="sep"></span>' if prev is not None and k != prev and k >= 0 else ""
        prev = k
        t = html.escape(text).replace("\n", "⏎<br>")
        if label is None:
            parts.append(f'{sep}<span class="plain">{t}</span>')
        else:
            c = SOURCE_COLORS[label]
            parts.append(f'{sep}<span class="tok" style="background:{tint(c, 0.35)};border-bottom:3px solid {c}" '
                         f'title="{label} · step {k}">{t}</span>')
    legend = "".join(f'<span class="key"><span class="sw" style="background:{SOURCE_COLORS[s]}"></span>{SOURCE_NAMES[s]}'
                     f'</span>' for s in ("root", "retrieval", "logits", "both", "lookup", "template"))
    return f"""<!doctype html><html><head><meta charset="utf-8"><style>
body {{ font-family: DejaVu Sans, sans-serif; margin: 14px; width: {WIDTH - 28}px; color: #222; }}
h3 {{ margin: 0 0 4px 0; font-weight: 500; }} .sub {{ color: #555; font-size: 12px; margin-bottom: 8px; }}
.legend {{ font-size: 12px; margin-bottom: 10px; }} .key {{ margin-right: 16px; }}
.sw {{ display: inline-block; width: 12px; height: 12px; margin-right: 5px; vertical-align: -1px; }}
.text {{ font-size: 15px; line-height: 1.9; white-space: pre-wrap; }}
.tok {{ padding: 1px 0; }} .plain {{ color: #777; }}
.sep {{ display: inline-block; width: 1px; height: 1.1em; background: #999; margin: 0 1px; vertical-align: -2px; }}
</style></head><body><h3>{html.escape(title)}</h3>
<div class="sub">Each token is coloured by how it was produced; thin bars mark step boundaries (one forward pass each).</div>
<div class="legend">{legend}</div><div class="text">{''.join(parts)}</div></body></html>"""


def screenshot_html(page: str, out: Path, height: int, browser: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        f = Path(tmp) / "page.html"
        f.write_text(page, encoding="utf-8")
        subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                        "--disable-background-networking", "--disable-component-update", "--hide-scrollbars",
                        f"--user-data-dir={tmp}/profile",
                        f"--screenshot={out}", f"--window-size={WIDTH},{height}", f.as_uri()],
                       check=True, capture_output=True, timeout=120)


def build(with_model: bool = True) -> tuple[dict[str, Any], dict[str, tuple[str, list, list]]]:
    """All gallery figures by file stem, plus coloured-text pages."""
    from . import samples as S
    from .acceptance_figure import acceptance_by_source, acceptance_histogram
    from .automaton_figure import automaton_figure
    from .benchmark_figure import benchmark_figure
    from .cost_figure import cost_figure
    from .latency_figure import latency_figure
    from .race_figure import race_figure
    from .text_spans import text_spans
    from .tree_figure import draft_tree_figure

    figs: dict[str, Any] = {
        "tree_64": draft_tree_figure(S.step_record(), S.decode, width=WIDTH),
        "tree_small": draft_tree_figure(S.small_step_record(), S.decode, width=WIDTH),
        "tree_120_compact": draft_tree_figure(S.big_step_record(), S.decode, width=WIDTH),
        "automaton": automaton_figure(S.automaton_snapshot(), S.decode, width=WIDTH),
        "race": race_figure(S.race_data(), width=WIDTH),
        "acceptance_hist": acceptance_histogram(S.accept_lengths(), width=WIDTH),
        "acceptance_by_source": acceptance_by_source(S.decode_steps(), width=WIDTH),
        "latency": latency_figure(S.latency_data(), width=WIDTH),
        "cost_curve": cost_figure(S.cost_curve(), width=WIDTH),
        "benchmark": benchmark_figure(S.benchmark_summary(), width=WIDTH),
    }
    pages = {"text_spans": ("Generated text by source (synthetic sample)",) + text_spans(S.decode_steps(), S.decode)}
    if with_model:
        steps, result = tiny_model_steps()
        best = max((s for s in steps if s.forwarded),
                   key=lambda s: (len(s.accepted) > 1, len(set(s.tree.sources)), len(s.tree), -s.index))
        figs["tiny_tree"] = draft_tree_figure(best, tiny_decode, width=WIDTH,
                                              title=f"Draft tree · step {best.index} (tiny random model, real RACER drafter)")
        with_snap = [s for s in steps if s.info.get("automaton")]
        cands = [(automaton_figure(s.info["automaton"], tiny_decode, width=WIDTH,
                                   title=f"Automaton · step {s.index} (tiny model, real drafter)"), s) for s in with_snap]
        figs["tiny_automaton"] = max(cands, key=lambda fs: (fs[0].layout.meta["fail_links"],
                                                            len({n["age"] for n in fs[1].info["automaton"]["nodes"]})))[0]
        figs["tiny_acceptance_by_source"] = acceptance_by_source(steps, width=WIDTH,
                                                                 title="Committed tokens by source (tiny model)")
        pages["tiny_text_spans"] = ("Generated text by source (tiny random model, real RACER drafter)",) + \
            text_spans(steps, tiny_decode)
        # The anatomy of one step (tiny model, real drafter and sizer; ids shown as sample words),
        # at the app's column width and at a phone's.
        data, table = tiny_anatomy()
        figs.update(anatomy_figures(data, table, S.word, ANATOMY_WIDTH))
        figs.update(anatomy_figures(data, table, S.word, PHONE_WIDTH, suffix="_phone"))
    return figs, pages


def render(outdir: Path, with_model: bool = True) -> list[Path]:
    import plotly.io as pio

    browser = _browser()
    outdir.mkdir(parents=True, exist_ok=True)
    figs, pages = build(with_model)
    paths = [outdir / f"{k}.png" for k in figs]
    t0 = time.perf_counter()
    pio.write_images(list(figs.values()), paths, width=[f.layout.width or WIDTH for f in figs.values()],
                     height=[f.layout.height or 500 for f in figs.values()], scale=1)
    out = list(paths)
    if browser:
        for k, (title, spans, step_of) in pages.items():
            lines = sum(len(t) for t, _ in spans) / 95 + sum(t.count("\n") for t, _ in spans)
            p = outdir / f"{k}.png"
            screenshot_html(spans_html(spans, step_of, title), p, int(130 + 29 * (lines + 1)), browser)
            out.append(p)
    print(f"rendered {len(out)} images to {outdir} in {time.perf_counter() - t0:.1f} s")
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--no-model", action="store_true", help="skip the tiny-model figures")
    args = ap.parse_args(argv)
    for p in render(args.outdir, with_model=not args.no_model):
        print(p)


if __name__ == "__main__":
    main()
