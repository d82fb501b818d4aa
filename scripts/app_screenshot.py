"""The README's screenshot: `python app.py` on the default model, one race of a shipped example,
the Race tab captured at laptop width (Debian's Chromium through Playwright).

    .venv/bin/python scripts/app_screenshot.py                # writes docs/app-race.png
    .venv/bin/python scripts/app_screenshot.py --out /tmp/race.png --example "Extract to JSON"

Run it on a quiet machine: the race's numbers are in the picture.
"""
from __future__ import annotations

import argparse
import re
from pathlib import Path

from app_server import app_server

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "docs" / "app-race.png"))
    ap.add_argument("--example", default="Rename in code", help="the example prompt's title")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    with app_server() as url:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(600_000)
            page.goto(url)
            page.locator("#model-status").get_by_text(re.compile("loaded in")).wait_for()
            page.get_by_role("tab", name="Settings").click()
            box = page.get_by_label("number input for Max new tokens")
            box.fill(str(args.max_new_tokens))
            box.press("Enter")
            page.get_by_role("tab", name="Race").click()
            page.get_by_text(args.example).first.click()
            page.locator("#run").click()
            page.locator("#race-status").get_by_text(re.compile("Finished")).wait_for()
            page.wait_for_timeout(1500)
            page.screenshot(path=args.out, full_page=True)
            browser.close()
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
