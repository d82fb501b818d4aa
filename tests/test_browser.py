"""Real-browser tests: `python app.py` on the default model, driven by Playwright through
Debian's Chromium (never `playwright install`). Screenshots go to artifacts/screenshots/
(laptop width 1366 and phone width 390); look at them.

Kept short: one server, one race of 48 tokens with a fixed tree size (so a fresh machine
does not first measure its cost curve), the inspector, every tab.
"""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--disable-background-networking", "--disable-component-update"]
ROOT = Path(__file__).resolve().parent.parent
SHOTS = ROOT / "artifacts" / "screenshots"
RACE_TOKENS = 48

if not os.path.exists(CHROMIUM):
    pytest.skip(f"{CHROMIUM} not found (install Debian's chromium to run browser tests)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(**env_extra: str):
    """`python app.py` on a free port (with `env_extra` in its environment) until the generator ends."""
    port = free_port()
    env = dict(os.environ, PORT=str(port), HOST="127.0.0.1", GRADIO_ANALYTICS_ENABLED="False", **env_extra)
    (ROOT / "artifacts").mkdir(exist_ok=True)
    log = open(ROOT / "artifacts" / "browser-server.log", "w")
    proc = subprocess.Popen([sys.executable, str(ROOT / "app.py")], cwd=ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    t0 = time.time()
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"app.py exited with {proc.returncode}; see artifacts/browser-server.log")
        try:
            urllib.request.urlopen(url, timeout=2)
            break
        except OSError:
            if time.time() - t0 > 180:
                proc.kill()
                raise RuntimeError("app.py did not start within 180 s")
            time.sleep(0.5)
    yield url
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


@pytest.fixture(scope="module")
def server():
    yield from serve()


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        yield b
        b.close()


@pytest.fixture(scope="module")
def page(browser, server):
    SHOTS.mkdir(parents=True, exist_ok=True)
    pg = browser.new_page(viewport={"width": 1366, "height": 900})
    pg.set_default_timeout(60_000)
    pg.goto(server)
    # The model loads once at start, with a visible status.
    pg.locator("#model-status").get_by_text(re.compile("loaded in")).wait_for(timeout=240_000)
    yield pg
    pg.close()


def shot(pg, name: str) -> None:
    pg.wait_for_timeout(400)
    pg.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def tab(pg, name: str) -> None:
    """Open a tab; on a narrow screen Gradio moves the last tabs into a "More tabs" menu."""
    t = pg.get_by_role("tab", name=name)
    if t.count() and t.first.is_visible():
        t.first.click()
        return
    pg.get_by_label("More tabs").first.click()  # the page's own tabs come before the inspector's views
    pg.locator(".overflow-dropdown button", has_text=name).click()


def set_number(pg, label: str, value: str) -> None:
    box = pg.get_by_label(f"number input for {label}")
    box.fill(value)
    box.press("Enter")


def plot_title(pg, elem_id: str) -> str:
    return pg.locator(f"#{elem_id} .gtitle").first.text_content(timeout=60_000) or ""


def test_page_loads_on_the_default_model(page):
    assert "SmolLM2" in page.locator("#model-status").inner_text()
    shot(page, "laptop-01-start")


@pytest.fixture(scope="module")
def raced(page):
    """The page after one race of RACE_TOKENS tokens at a fixed tree size: the inspector, the
    anatomy, the what-if and the trace tests read its traces, so each of them also runs alone."""
    tab(page, "Settings")
    page.get_by_role("radio", name="fixed").check()          # a fresh machine would first measure its cost curve for "auto"
    set_number(page, "Max new tokens", str(RACE_TOKENS))
    set_number(page, "Fixed capacity (nodes incl. root)", "16")
    shot(page, "laptop-05-settings")
    tab(page, "Race")
    page.get_by_text("Rename in code").first.click()
    sync_api.expect(page.locator("#prompt textarea")).to_have_value(re.compile("celsius"))
    page.locator("#run").click()
    page.locator("#race-status").get_by_text(re.compile("Finished")).wait_for(timeout=600_000)
    return page


def test_race_runs_to_the_end(raced):
    page = raced
    tab(page, "Race")
    for m in ("racer", "ar", "tr"):
        stats = page.locator(f"#stats-{m}").inner_text()
        n = int(re.search(r"(\d+)\s*tokens", stats).group(1))
        assert 1 <= n <= RACE_TOKENS and "finished" in stats, stats
        assert page.locator(f"#text-{m}").inner_text().strip()
    assert "Identical outputs" in page.locator("#verdict").inner_text()
    assert "Race" in plot_title(page, "race-plot")
    shot(page, "laptop-02-race")


def test_inspector_slider_changes_the_tree(raced):
    page = raced
    tab(page, "Step inspector")
    page.locator("#insp-header").get_by_text("Inspecting").wait_for()
    page.get_by_text("Draft tree of step 1").first.wait_for()
    first = plot_title(page, "tree-plot")
    shot(page, "laptop-03-inspector-step1")
    page.locator("#next").click()
    page.get_by_text("Draft tree of step 2").first.wait_for()
    assert plot_title(page, "tree-plot") != first
    # the slider itself (keyboard on its range input)
    rng = page.locator("#step-slider input[type=range]")
    rng.focus()
    rng.press("ArrowRight")
    page.get_by_text("Draft tree of step 3").first.wait_for()
    assert "Step 3 of" in page.locator("#step-sentence").inner_text()
    # clicking a token of the text jumps to the step that produced it
    tokens = page.locator("#insp-text .token")
    tokens.nth(tokens.count() - 1).click()
    page.wait_for_function("() => !document.querySelector('#step-sentence').innerText.includes('Step 3 of')")
    shot(page, "laptop-03-inspector-clicked")


STAGES = ("Match", "Retrieval", "Logits", "Merge & size", "Tree attention", "Verify", "Update")


def test_anatomy_walks_all_seven_stages_of_a_raced_step(raced):
    """The race's RACER trace (a real-model run): step 2 taken apart stage by stage."""
    page = raced
    tab(page, "Step inspector")
    page.locator("#insp-header").get_by_text("the last race").wait_for()
    box = page.locator("#step-slider input[type=number]")
    box.fill("2")
    box.press("Enter")
    page.locator("#step-sentence").get_by_text("Step 2 of").wait_for()
    page.get_by_role("tab", name=re.compile("Anatomy")).click()
    page.locator("#stage-text").get_by_text(re.compile(r"^1 ·")).wait_for()
    for i, name in enumerate(STAGES):
        if i:
            page.locator("#stage-next").click()
        page.locator("#stage-text").get_by_text(re.compile(rf"^{i + 1} ·")).wait_for()
        text = page.locator("#stage-text").inner_text()
        assert "could not" not in text, text
        assert plot_title(page, "stage-plot").startswith(f"{i + 1} ·"), plot_title(page, "stage-plot")
        if name == "Logits":
            assert page.locator("#stage-layer").is_visible()
        shot(page, f"laptop-07-anatomy-{i + 1}")
    page.locator("#stage-prev").click()
    page.locator("#stage-text").get_by_text(re.compile(r"^6 ·")).wait_for()


def test_every_what_if_answers(raced):
    page = raced
    tab(page, "Step inspector")
    page.get_by_role("tab", name="What if?").click()
    answer = page.locator("#wi-text")
    answer.get_by_text("would have committed").wait_for()
    assert "Why was" in page.locator("#why-missed").inner_text() or "Nothing was missed" in \
        page.locator("#why-missed").inner_text()
    # Each answer names its variant ("without retrieval, the run's size: …"), so a stale answer never passes.
    checks = [("#wi-sources", "retrieval", "without retrieval, the run's size:"),
              ("#wi-sources", "retrieval", "all sources, the run's size:"),
              ("#wi-sources", "logits", "without logits, the run's size:"),
              ("#wi-sources", "logits", "all sources, the run's size:"),
              ("#wi-sources", "lookup", "without lookup, the run's size:"),
              ("#wi-sources", "lookup", "all sources, the run's size:"),
              ("#wi-capacity", "8", "all sources, 8 nodes:"), ("#wi-capacity", "16", "all sources, 16 nodes:"),
              ("#wi-capacity", "64", "all sources, 64 nodes:"),
              ("#wi-rule", "released", "all sources, 64 nodes, released breadth rule:")]
    for where, label, expect in checks:
        page.locator(where).get_by_text(label, exact=True).click()
        answer.get_by_text(expect).first.wait_for()
        assert "would have committed" in answer.inner_text()
    assert page.locator("#wi-table").inner_text().count("without") >= 3
    shot(page, "laptop-08-what-if")


def test_a_trace_exports_and_loads_back(raced, tmp_path):
    page = raced
    tab(page, "Step inspector")
    page.locator("#trace-acc").get_by_text("Traces:").click()
    page.locator("#trace-export").click()
    link = page.locator("#trace-file a").first
    link.wait_for()
    with page.expect_download() as dl:
        link.click()
    path = tmp_path / "trace.json.gz"
    dl.value.save_as(path)
    assert path.stat().st_size > 1000
    with page.expect_file_chooser() as chooser:
        page.locator("#trace-load").click()
    chooser.value.set_files(str(path))
    page.locator("#trace-note").get_by_text("Loaded").wait_for()
    page.locator("#insp-header").get_by_text("a loaded trace").wait_for()
    page.get_by_role("tab", name=re.compile("Anatomy")).click()
    page.locator("#stage-text").get_by_text(re.compile(r"^\d ·")).wait_for()
    # the shipped examples
    page.locator("#trace-pick input").click()
    page.get_by_role("option", name="One-line joke").click()
    page.locator("#insp-header").get_by_text("a trace that ships").wait_for()
    shot(page, "laptop-09-traces")


def test_tabs_switch_and_render(page):
    tab(page, "How it works")
    page.locator("#explain-intro").get_by_text("Preset run").wait_for(timeout=600_000)
    page.locator("#explain-tree .js-plotly-plot").wait_for()
    shot(page, "laptop-04-how-it-works")
    page.get_by_text("Step through the first preset run in the Step inspector").click()
    page.locator("#insp-header").get_by_text("the preset run").wait_for()     # switched tab, preset loaded
    tab(page, "Benchmark")
    page.locator("#bench-status").get_by_text(re.compile("benchmark|Showing")).wait_for()
    shot(page, "laptop-06-benchmark")
    tab(page, "Race")
    page.locator("#run").wait_for()


def test_phone_width(browser, server):
    pg = browser.new_page(viewport={"width": 390, "height": 844}, device_scale_factor=1)
    pg.set_default_timeout(60_000)
    pg.goto(server)
    pg.locator("#model-status").get_by_text(re.compile("loaded in")).wait_for(timeout=240_000)
    tab(pg, "Settings")
    pg.get_by_role("radio", name="fixed").check()
    set_number(pg, "Max new tokens", "24")
    tab(pg, "Race")
    pg.get_by_text("Summarise a passage").first.click()
    sync_api.expect(pg.locator("#prompt textarea")).to_have_value(re.compile("Westbury"))
    pg.locator("#run").click()
    pg.locator("#race-status").get_by_text(re.compile("Finished")).wait_for(timeout=600_000)
    # nothing wider than the screen (horizontal scrolling = clipped content)
    width = pg.evaluate("() => document.documentElement.scrollWidth")
    shot(pg, "phone-02-race")
    assert width <= 390 + 2, f"page is {width}px wide on a 390px screen"
    tab(pg, "Step inspector")
    pg.get_by_text("Draft tree of step 1").first.wait_for()
    shot(pg, "phone-03-inspector")
    tab(pg, "How it works")
    pg.locator("#explain-tree .js-plotly-plot").wait_for(timeout=600_000)
    shot(pg, "phone-04-how-it-works")
    pg.close()
