"""The dashboard in a real headless Chromium (the distribution's, driven by Playwright, which downloads no
browser of its own): the key prompt, the session list with its usage bars, a compacted session whose marker
expands to the summary and the original messages, the plot, the journal, a session of 10,000 messages read in
pages, a stream in flight, and a narrow window. Screenshots go to the test's tmp dir."""

from __future__ import annotations

import shutil
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from playwright.async_api import Browser, Page, async_playwright, expect

from tests.conftest import ServeProxy
from tests.e2e.test_compaction_e2e import SMALL_WINDOW
from tests.e2e.test_dashboard_e2e import read_stream, start, store_long_session
from tests.support.fake_upstream import FakeUpstream, Reply
from tests.support.proxy_server import ProxyServer
from tests.support.scripted_session import ScriptedSession, install_responder

KEY = "sk-dashboard-browser"
CHROMIUM_FLAGS = [
    # As root (CI) Chromium needs --no-sandbox; the others keep it off the (closed) network.
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
DESKTOP = {"width": 1280, "height": 900}
NARROW = {"width": 390, "height": 844}
TIMEOUT_MS = 15_000


def chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    pytest.fail("No Chromium on PATH: install the distribution's package (apt-get install chromium); .ci/run does.")


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=chromium(), headless=True, args=CHROMIUM_FLAGS)
        try:
            yield launched
        finally:
            await launched.close()


@pytest.fixture
def served(serve_proxy: ServeProxy, fake: FakeUpstream) -> dict[str, Any]:
    """A keyed proxy with a compacted agent session, a short chat and a session of 10,000 messages."""
    fake.context_window = SMALL_WINDOW
    install_responder(fake)
    proxy = start(serve_proxy, fake, keys=[KEY])
    with openai.OpenAI(base_url=proxy.base_url, api_key=KEY, max_retries=0, timeout=30) as client:
        agent = ScriptedSession(client, fake, "agent-session", tool_every=3, stream_every=4)
        agent.run(24)
        ScriptedSession(client, fake, "short-chat").run(2)
    store_long_session(proxy, fake, KEY, "ten-thousand")
    return {"proxy": proxy, "agent": agent}


async def signed_in(
    browser: Browser, proxy: ProxyServer, viewport: dict[str, int], screenshot: Path | None = None
) -> Page:
    """The page opened as a newcomer does: it asks for the key (`screenshot`: of that form), which is given."""
    page = await browser.new_page(viewport=viewport)  # type: ignore[arg-type]
    page.set_default_timeout(TIMEOUT_MS)
    await page.goto(f"{proxy.url}/ui")
    await expect(page.locator("#key-form")).to_be_visible()
    if screenshot is not None:
        await page.screenshot(path=screenshot)
    await page.fill("#key", KEY)
    await page.locator("#key-form button[type=submit]").click()
    await expect(page.locator("table#sessions tr.session-row").first).to_be_visible()
    return page


async def api(proxy: ProxyServer, path: str) -> Any:
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {KEY}"}, timeout=10) as client:
        response = await client.get(f"{proxy.url}{path}")
    assert response.status_code == 200, response.text
    return response.json()


async def no_horizontal_overflow(page: Page) -> None:
    overflow = await page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 1, f"the page is {overflow}px wider than the window"


async def test_the_dashboard_shows_sessions_and_a_marker_expands_to_its_originals(
    browser: Browser, served: dict[str, Any], tmp_path: Path
) -> None:
    proxy: ProxyServer = served["proxy"]
    agent: ScriptedSession = served["agent"]
    page = await signed_in(browser, proxy, DESKTOP, tmp_path / "key-desktop.png")

    rows = page.locator("table#sessions tr.session-row")
    assert sorted(await rows.evaluate_all("rows => rows.map(r => r.dataset.sessionId)")) == [
        "agent-session",
        "short-chat",
        "ten-thousand",
    ]
    listing = await api(proxy, "/sessions")
    for line in listing["data"]:
        row = page.locator(f'tr.session-row[data-session-id="{line["id"]}"]')
        await expect(row.locator(".usage-text")).to_have_text(line["usage"]["text"])
        await expect(row.locator(".usage-bar")).to_have_class(f"usage-bar {line['usage']['severity']}")
    await page.screenshot(path=tmp_path / "sessions-desktop.png", full_page=True)

    await page.locator('tr.session-row[data-session-id="agent-session"] a.session-link').click()
    view = page.locator("#session-view")
    await expect(view).to_contain_text("agent-session")
    plot = page.locator("svg#usage-plot")
    turns = sum(len(turn.chat_requests) for turn in agent.turns)
    await expect(plot.locator(".turn-point")).to_have_count(turns)
    assert await plot.locator(".compaction-mark").count() >= 1
    await expect(page.locator("table#journal tr.step-row").first).to_be_visible()
    assert await page.locator("table#journal .status.status-sealed").count() >= 1

    marker = page.locator("#conversation .marker").first
    await expect(marker).to_contain_text("summarize")
    span_id = await marker.get_attribute("data-span-id")
    span = await api(proxy, f"/ui/api/sessions/agent-session/spans/{span_id}?limit=500")
    assert not await marker.locator(".marker-originals .msg").count()
    await marker.locator("button.marker-toggle").click()
    await expect(marker.locator(".marker-summary")).to_contain_text(span["span"]["content"][:60])
    originals = marker.locator(".marker-originals .msg")
    await expect(originals.first).to_be_visible()
    start = span["span"]["start"]
    first_text = str(agent.messages[start]["content"])
    await expect(originals.first.locator(".content")).to_contain_text(first_text[:80])
    assert await originals.count() == min(span["total"], 100)
    await page.screenshot(path=tmp_path / "session-desktop.png", full_page=True)

    await marker.locator("button.marker-toggle").click()
    await expect(marker.locator(".marker-originals")).to_be_hidden()

    await page.set_viewport_size(NARROW)  # type: ignore[arg-type]
    # Drawn again at the narrow width, so its labels keep their size.
    await page.wait_for_function(f"document.getElementById('usage-plot').viewBox.baseVal.width < {NARROW['width']}")
    await no_horizontal_overflow(page)
    await page.screenshot(path=tmp_path / "session-narrow.png", full_page=True)
    await page.goto(f"{proxy.url}/ui/#/")
    await expect(page.locator("table#sessions tr.session-row").first).to_be_visible()
    await no_horizontal_overflow(page)
    await page.screenshot(path=tmp_path / "sessions-narrow.png", full_page=True)
    await page.close()
    assert all((tmp_path / name).stat().st_size > 10_000 for name in ("session-desktop.png", "session-narrow.png"))


async def test_a_long_session_loads_in_pages_and_a_live_stream_shows_up(
    browser: Browser, served: dict[str, Any], fake: FakeUpstream, tmp_path: Path
) -> None:
    proxy: ProxyServer = served["proxy"]
    page = await signed_in(browser, proxy, DESKTOP)
    await page.goto(f"{proxy.url}/ui/#/s/ten-thousand")
    conversation = page.locator("#conversation")
    await expect(conversation.locator(".msg").first).to_be_visible()
    assert await conversation.locator(".msg").count() == 100
    await conversation.locator("button.load-more").click()
    await expect(conversation.locator(".msg")).to_have_count(200)
    await expect(conversation.locator(".msg").nth(199).locator(".content")).to_have_text("message 199")

    fake.responder = lambda body: Reply(content="streaming into the dashboard " * 12)
    fake.chunk_delay_s = 0.15
    worker = threading.Thread(target=read_stream, args=(proxy, KEY, "live-session"))
    worker.start()
    try:
        # Scrolled down the long session, the sticky header says a stream is running; it leads to the panel.
        badge = page.locator("#nav-streams")
        await expect(badge).to_have_text("1 in flight", timeout=TIMEOUT_MS)
        await page.screenshot(path=tmp_path / "stream-badge-desktop.png")
        await badge.click()
        stream = page.locator("#streams .stream").first
        await expect(stream).to_be_in_viewport()
        await expect(stream).to_contain_text("live-session")
        await expect(stream).to_contain_text("streaming into")
        await page.screenshot(path=tmp_path / "stream-desktop.png")
    finally:
        worker.join(60)
    await expect(page.locator("#streams .stream")).to_have_count(0, timeout=TIMEOUT_MS)
    await expect(page.locator("#nav-streams")).to_be_hidden()
    await page.close()
