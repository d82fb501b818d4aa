"""Real-browser check of the fair share (issue 26), two tabs on `python app.py`: a race waiting
behind another tab's shows its place and a live Stop, Stop takes it out of the queue, and a tab
closed mid-race gives the decode slot to the waiting one. Same server and browser setup as
tests/test_browser.py (Debian's Chromium through Playwright)."""
from __future__ import annotations

import re

import pytest

from tests.test_browser import browser, server, set_number, tab  # noqa: F401 - fixtures

pytestmark = pytest.mark.browser
sync_api = pytest.importorskip("playwright.sync_api")
expect = sync_api.expect

LONG = "Count from one to two hundred in words, one number per line."


def open_tab(browser, url):  # noqa: F811 - the fixture
    pg = browser.new_page(viewport={"width": 1366, "height": 900})
    pg.set_default_timeout(120_000)
    pg.goto(url)
    pg.locator("#model-status").get_by_text(re.compile("loaded in")).wait_for(timeout=240_000)
    return pg


def test_queued_race_shows_its_place_stops_and_takes_a_closed_tabs_slot(browser, server):  # noqa: F811
    a, b = open_tab(browser, server), open_tab(browser, server)
    tab(a, "Settings")
    a.get_by_role("radio", name="fixed").check()
    set_number(a, "Max new tokens", "400")
    tab(a, "Race")
    a.locator("#prompt textarea").fill(LONG)
    a.locator("#run").click()
    a.locator("#race-status").get_by_text(re.compile("Racing on")).wait_for()

    b.locator("#prompt textarea").fill("Say hello.")
    expect(b.locator("#stop")).to_be_disabled()                  # nothing to stop yet
    b.locator("#run").click()
    # The queue's own line, not the admission's "1 request ahead" shown before the decode joins
    # the queue: Stop in that moment says the race "will not start" instead.
    expect(b.locator("#race-queue")).to_contain_text("number 1 in the queue")
    expect(b.locator("#stop")).to_be_enabled()
    expect(b.locator("#run")).to_be_disabled()
    b.locator("#stop").click()
    expect(b.locator("#race-status")).to_contain_text("taken out of the queue")
    expect(b.locator("#run")).to_be_enabled()
    expect(b.locator("#stop")).to_be_disabled()

    b.locator("#run").click()                                     # queue again behind tab a ...
    expect(b.locator("#race-queue")).to_contain_text("number 1 in the queue")
    assert "Finished" not in a.locator("#race-status").inner_text(), "tab a finished first: nothing was tested"
    a.close()                                                     # ... and tab a goes away mid-race
    b.locator("#race-status").get_by_text(re.compile("Racing on|Finished")).wait_for()
    b.locator("#race-status").get_by_text(re.compile("Finished")).wait_for(timeout=300_000)
    expect(b.locator("#race-queue")).to_have_text("")
    b.close()
