"""Real-browser check that the race's speed-up holds under load (issue 21): a copy-heavy shipped
example raced from a Chromium page, with the page's "race 3×" switch on, while a second visitor
steps through the inspector, must report RACER's speed-up within a band of the same prompt
raced through the API with nothing else running (also 3×, the median; the mean of one such series
before the busy one and one after it).

The band, 0.78–1.45× the API figure, is tight enough that the skews seen before the clock was
fixed fail (9.1× against 4.7× is 1.9, 3.5× against 4.7× is 0.74) and as wide as the noise of a
shared 2-core machine needs. Its upper side is the wider because wall time, the clock before
the quiet-level one, let load lift RACER's speed-up (a stalled forward costs every method alike
and plain decoding makes four times as many): at 128 tokens on an AVX512-BF16 CPU five runs
measured 1.05–1.27 with it. With disturbed steps charged their quiet estimate
(docs/PERFORMANCE.md §8) the busy races read what quiet ones do. The example is the one
scripts/race_check.py races ("Summarise a passage", with its system prompt): "Extract to JSON",
used before, now ends after 41 tokens in bfloat16, too short a race to tell clocks apart.
Same server and browser setup as tests/test_browser.py (Debian's Chromium through Playwright),
except the server's time limits: on a 2-core CPU the Chromium page, the second visitor and the
race share the two cores, and a busy series that takes 44 s quiet ran past the app's 240 s for a
race 3× (AVX2-only CPU, float32: 85 s a race). The test is about the speed-up under load, not
the limit (tests/test_reliability.py covers that), so its server allows 900 s.
"""
from __future__ import annotations

import json
import re
import sys
import time

import pytest

from tests.test_browser import ROOT, browser, serve, set_number, tab  # noqa: F401 - fixtures

sys.path.insert(0, str(ROOT / "scripts"))
from race_check import DEFAULT_EXAMPLE, Inspector, settings  # noqa: E402 - the example, the second visitor, the Settings values

pytestmark = pytest.mark.browser
sync_api = pytest.importorskip("playwright.sync_api")
gradio_client = pytest.importorskip("gradio_client")

EXAMPLE = DEFAULT_EXAMPLE
MAX_NEW = 128
BAND = (0.78, 1.45)
SERIES_LIMIT_S = 900


@pytest.fixture(scope="module")
def server():
    yield from serve(RACER_TIME_LIMIT_S=str(SERIES_LIMIT_S), RACER_BENCH_TIME_LIMIT_S=str(SERIES_LIMIT_S))


def median_speedup(verdict: str) -> float:
    """RACER's median decoding-only speed-up from a repeated race's verdict (markdown or page text)."""
    m = re.search(r"Median of 3 races.*?decoding time only: RACER ([\d.]+)×", verdict.replace("*", ""), re.S)
    assert m, verdict
    return float(m.group(1))


def test_race_speedup_from_a_busy_browser_matches_a_quiet_api_race(browser, server):  # noqa: F811
    ex = {e["title"]: e for e in json.loads((ROOT / "assets" / "examples.json").read_text())}[EXAMPLE]
    api = gradio_client.Client(server, verbose=False)

    walls: dict[str, float] = {}

    def quiet_race(name: str) -> float:
        t0 = time.perf_counter()
        out = api.predict(0, ex["prompt"], ex.get("system", ""), *settings(MAX_NEW), True, api_name="/race")
        walls[name] = round(time.perf_counter() - t0, 1)
        assert "Finished 3 of 3 races" in out[0], out[0]
        return median_speedup(out[8])

    before = quiet_race("api_quiet_before_s")

    insp = Inspector(server)
    insp.start()
    insp.resume()
    try:
        pg = browser.new_page(viewport={"width": 1366, "height": 900})
        pg.set_default_timeout(300_000)
        pg.goto(server)
        pg.locator("#model-status").get_by_text(re.compile("loaded in")).wait_for()
        tab(pg, "Settings")
        set_number(pg, "Max new tokens", str(MAX_NEW))
        tab(pg, "Race")
        pg.get_by_text(EXAMPLE).first.click()
        pg.locator("#repeat input").check()
        status = pg.locator("#race-status")
        t0 = time.perf_counter()
        pg.locator("#run").click()
        status.get_by_text(re.compile("Race 2 of 3")).wait_for()
        status.get_by_text(re.compile("Finished 3 of 3 races|Time limit|Stopped")).wait_for(
            timeout=(SERIES_LIMIT_S + 60) * 1000)
        walls["browser_busy_s"] = round(time.perf_counter() - t0, 1)
        assert "Finished 3 of 3 races" in status.inner_text(), status.inner_text()
        busy = median_speedup(pg.locator("#verdict").inner_text())
        stats = pg.locator("#stats-racer").inner_text()
        pg.close()
    finally:
        insp.stop()
    assert insp.renders > 3, "the second visitor hardly used the inspector: the race ran unloaded"
    assert "Median of 3 races" in stats
    # Quiet series before and after the busy one: the machine's own drift between them (minutes on a
    # shared host) is shared out rather than counted against the race.
    after = quiet_race("api_quiet_after_s")
    quiet = (before + after) / 2
    ratio = busy / quiet
    (ROOT / "artifacts").mkdir(exist_ok=True)
    (ROOT / "artifacts" / "browser-race.json").write_text(json.dumps(
        {"api_quiet_before": before, "api_quiet_after": after, "browser_busy": busy, "ratio": round(ratio, 3), "inspector_renders": insp.renders, **walls}))
    assert BAND[0] <= ratio <= BAND[1], (f"RACER {busy:.2f}× from the busy browser against {quiet:.2f}× through the "
                                         f"quiet API ({ratio:.2f}, band {BAND})")
