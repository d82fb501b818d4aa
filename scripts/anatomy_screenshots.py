"""Screenshots of the step inspector's anatomy (every stage) and "what if" for docs/FIGURES.md:
`python app.py`, the shipped example trace of one step, Debian's Chromium through Playwright.

    .venv/bin/python scripts/anatomy_screenshots.py                       # docs/anatomy/*.png
    .venv/bin/python scripts/anatomy_screenshots.py --step 2 --width 390   # a phone's width

The example traces are real runs of the default model (assets/traces), so the pictures are the
same on every machine; nothing here decodes.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from app_server import app_server

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
STAGES = ("Match", "Retrieval", "Logits", "Merge & size", "Tree attention", "Verify", "Update")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "docs" / "anatomy"))
    ap.add_argument("--trace", default="Rename in code", help="the example trace's title")
    ap.add_argument("--step", type=int, default=2, help="the step to take apart (1-based)")
    ap.add_argument("--width", type=int, default=1280)
    ap.add_argument("--url", help="a running app's address (default: start one)")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    suffix = "" if args.width >= 700 else "-phone"
    with app_server(args.url) as url:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            page = browser.new_page(viewport={"width": args.width, "height": 900})
            page.set_default_timeout(120_000)
            page.goto(url)
            page.get_by_role("tab", name="Step inspector").click()
            page.locator("#insp-header").get_by_text(re.compile("Inspecting")).wait_for()
            page.locator("#trace-acc").get_by_text("Traces:").click()
            page.locator("#trace-pick input").click()
            page.get_by_role("option", name=args.trace).first.click()
            page.locator("#trace-note").get_by_text("Loaded").wait_for()
            box = page.locator("#step-slider input[type=number]")
            box.fill(str(args.step))
            box.press("Enter")
            page.locator("#step-sentence").get_by_text(f"Step {args.step} of").wait_for()
            page.get_by_role("tab", name=re.compile("Anatomy")).click()
            for i, name in enumerate(STAGES):
                page.locator("#stage").get_by_text(f"{i + 1} {name}", exact=True).click()
                page.locator("#stage-text").get_by_text(re.compile(rf"^{i + 1} ·")).wait_for()
                page.wait_for_timeout(1200)
                page.locator("#view-anatomy").screenshot(path=str(out / f"stage{i + 1}{suffix}.png"))
                print("stage", i + 1)
            page.get_by_role("tab", name="What if?").click()
            page.locator("#wi-text").get_by_text("would have committed").wait_for()
            page.locator("#wi-capacity").get_by_text("64", exact=True).click()
            page.locator("#wi-text").get_by_text("64 nodes").wait_for()
            page.wait_for_timeout(1200)
            page.locator("#view-whatif").screenshot(path=str(out / f"what-if{suffix}.png"))
            browser.close()
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
